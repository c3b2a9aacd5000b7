"""Errors of the view store (Redis): one root, ``StoreError``. The HTTP API maps them to answers."""

from __future__ import annotations


class StoreError(Exception):
    """Root of every error raised by ``serving.store``."""


class LayoutError(StoreError):
    """The store holds data laid out another way (another bucket count) than the caller's settings."""

    @classmethod
    def check(cls, pipeline: str, laid_out: bytes | str | None, buckets: int) -> None:
        """Raised unless the layout the store recorded (None: none yet) is ``buckets`` buckets."""
        if laid_out is not None and int(laid_out) != buckets:
            raise cls(f"the serving store of {pipeline!r} is laid out in {int(laid_out)} buckets, not {buckets}: "
                      f"use buckets={int(laid_out)} in the Redis URL (redis+cluster://...?buckets={int(laid_out)}), "
                      "or start on an empty Redis")


class ReplicationError(StoreError):
    """A write was not acknowledged by the replicas it must reach before it counts as done."""


class StoreUnavailableError(StoreError):
    """The store cannot answer correctly right now (Redis unreachable, nothing published, an answer would go
    back in versions); the message says why and what to do. ``retry_after``: seconds after which asking
    again may succeed (None: no estimate). The HTTP API answers it with 503."""

    def __init__(self, message: str, *, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class GenerationLostError(StoreError):
    """Redis lost its data (an epoch marker changed) while a generation was being published: it is not served."""


class LogicConflictError(StoreError):
    """A generation's realtime segment is claimed for other pipeline logic than the generation's: it is not served."""
