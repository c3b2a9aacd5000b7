"""Errors of the view store (Redis): one root, ``StoreError``. The HTTP API maps them to answers."""

from __future__ import annotations


class StoreError(Exception):
    """Root of every error raised by ``serving.store``."""


class LayoutError(StoreError):
    """The store holds data laid out another way (another bucket count) than the caller's settings."""


class ReplicationError(StoreError):
    """A write was not acknowledged by the replicas it must reach before it counts as done."""
