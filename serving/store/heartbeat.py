"""The speed layer's heartbeat (``Keys.speed``): what it processed, when it last said so, what it does.

Written by the speed layer (``speed_layer.job``); read by the API's health and view listing,
its metrics and ``lambda-platform status``. This module is the one reader of the hash.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from serving.store.replies import HashReply, text_hash

#: A heartbeat older than this many seconds means the speed layer is down (it beats every 0.5 s).
HEARTBEAT_FRESH_SECONDS = 10.0


@dataclass(frozen=True)
class SpeedHeartbeat:
    """One reading of the speed layer's heartbeat hash."""

    processed: int | None
    """The last master version whose micro-batch is committed (None: never ran)."""
    beat_at: float | None
    """When it last beat (epoch seconds), None if it never ran."""
    state: str | None
    """``running``, or why it waits."""
    ui_url: str | None
    """Its Spark UI, when enabled."""

    @classmethod
    def from_hash(cls, values: HashReply) -> SpeedHeartbeat:
        """From ``HGETALL Keys.speed`` (bytes or decoded)."""
        fields = text_hash(values)
        return cls(
            processed=int(fields["processed"]) if fields.get("processed") else None,
            beat_at=float(fields["heartbeat_at"]) if fields.get("heartbeat_at") else None,
            state=fields.get("state") or None,
            ui_url=fields.get("ui_url") or None,
        )

    def seconds_ago(self, now: float | None = None) -> float | None:
        """Seconds since the last beat, None if it never beat."""
        return None if self.beat_at is None else (time.time() if now is None else now) - self.beat_at

    def alive(self, now: float | None = None) -> bool:
        """True when the last beat is fresher than ``HEARTBEAT_FRESH_SECONDS``."""
        ago = self.seconds_ago(now)
        return ago is not None and ago < HEARTBEAT_FRESH_SECONDS
