"""The clock a request's relative times (``from=-1h``, ``last=15m``, ``window_end=now``) are resolved against.

One reading per request (``serving.api.windows``), echoed in the answer as ``now``. The app takes its
clock at creation (``create_app(..., clock=...)``): tests give a fixed one, never a patched ``datetime``.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Protocol


class Clock(Protocol):
    """Where "now" comes from."""

    def now(self) -> datetime:
        """The current time, aware, in UTC."""


class SystemClock:
    """The machine's clock."""

    def now(self) -> datetime:
        return datetime.now(timezone.utc)
