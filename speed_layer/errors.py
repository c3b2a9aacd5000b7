"""Errors of the speed layer: one root, ``SpeedLayerError``."""

from __future__ import annotations


class SpeedLayerError(RuntimeError):
    """Root of the speed layer's errors."""


class EpochChangedError(SpeedLayerError):
    """Redis lost its data under the speed layer: its segments must be rebuilt from the served generation."""


class NothingServedError(SpeedLayerError):
    """No batch generation is served: a fresh query has nothing to start after (it waits for one)."""


class NonFiniteValueError(SpeedLayerError, ValueError):
    """A measure's realtime value is NaN or infinite: no sorted set can rank it, no sum holds it."""
