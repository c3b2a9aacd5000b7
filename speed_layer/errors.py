"""Errors of the speed layer: one root, ``SpeedLayerError``."""

from __future__ import annotations


class SpeedLayerError(RuntimeError):
    """Root of the speed layer's errors."""


class EpochChangedError(SpeedLayerError):
    """Redis lost its data under the speed layer: its segments must be rebuilt from the served generation."""


class NothingServedError(SpeedLayerError):
    """No batch generation is served: a fresh query has nothing to start after (it waits for one)."""

