"""Errors of the view store (Redis): one root, ``StoreError``. The HTTP API maps them to answers."""

from __future__ import annotations


class StoreError(Exception):
    """Root of every error raised by ``serving.store``."""
