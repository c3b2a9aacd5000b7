"""How far the served answers are behind the master dataset, in versions and in seconds."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from batch_layer.master.delta_log import LogHead, read_commit
from batch_layer.master.object_store import Location


@dataclass(frozen=True)
class Freshness:
    latest_version: int | None
    processed_version: int | None
    lag_versions: int | None
    lag_seconds: float | None


class MasterClock:
    """The master dataset's newest version and commit times, read from its Delta log (cached briefly)."""

    def __init__(self, path: Location, ttl: float = 0.5) -> None:
        self.path, self.ttl = path, ttl
        self._head = LogHead(path)
        self._read_at = 0.0
        self._lock = asyncio.Lock()

    def _latest(self) -> int | None:
        latest = self._head.version(refresh=time.monotonic() - self._read_at > self.ttl)
        if latest is not None:
            self._read_at = time.monotonic()
        return latest

    def commit_time(self, version: int) -> float | None:
        """Commit timestamp (epoch seconds) of ``version``, from its commitInfo; None if not in the log."""
        commit = read_commit(self.path, version)
        return commit.timestamp if commit is not None else None

    async def freshness(self, processed: int | None, served: int | None) -> Freshness:
        async with self._lock:
            latest = await asyncio.to_thread(self._latest)
        covered = max(v for v in (processed, served, -1) if v is not None)
        if latest is None or covered < 0:
            return Freshness(latest, processed, None, None)
        lag = max(0, latest - covered)
        oldest = await asyncio.to_thread(self.commit_time, covered + 1) if lag else None
        return Freshness(latest, processed, lag, max(0.0, time.time() - oldest) if oldest else 0.0)
