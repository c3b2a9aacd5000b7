"""How far the served answers are behind the master dataset, in versions and in seconds."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from pathlib import Path

from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError


@dataclass(frozen=True)
class Freshness:
    latest_version: int | None
    processed_version: int | None
    lag_versions: int | None
    lag_seconds: float | None


class MasterClock:
    """The master dataset's newest version and commit times, read from its Delta log (cached briefly)."""

    def __init__(self, path: Path, ttl: float = 0.5) -> None:
        self.path, self.ttl = path, ttl
        self._table: DeltaTable | None = None
        self._read_at = 0.0
        self._lock = asyncio.Lock()

    def _latest(self) -> int | None:
        try:
            if self._table is None:
                self._table = DeltaTable(str(self.path))
            elif time.monotonic() - self._read_at > self.ttl:
                self._table.update_incremental()
        except TableNotFoundError:
            return None
        self._read_at = time.monotonic()
        return self._table.version()

    def commit_time(self, version: int) -> float | None:
        """Commit timestamp (epoch seconds) of ``version``, from its commitInfo."""
        try:
            with (self.path / "_delta_log" / f"{version:020d}.json").open() as log:
                for line in log:
                    info = json.loads(line).get("commitInfo")
                    if info and "timestamp" in info:
                        return info["timestamp"] / 1000
        except FileNotFoundError:
            return None
        return None

    async def freshness(self, processed: int | None, served: int | None) -> Freshness:
        async with self._lock:
            latest = await asyncio.to_thread(self._latest)
        covered = max(v for v in (processed, served, -1) if v is not None)
        if latest is None or covered < 0:
            return Freshness(latest, processed, None, None)
        lag = max(0, latest - covered)
        oldest = await asyncio.to_thread(self.commit_time, covered + 1) if lag else None
        return Freshness(latest, processed, lag, max(0.0, time.time() - oldest) if oldest else 0.0)
