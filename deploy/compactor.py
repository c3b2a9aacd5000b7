"""Keeping the master dataset's file count small while the platform runs (until upkeep has its own home).

Every HTTP ingest is one Delta commit with one small parquet file: demo traffic leaves hundreds of
files a minute, and every commit and every snapshot gets slower with their number. The batch
scheduler therefore compacts the master dataset (OPTIMIZE) every ``LAMBDA_MASTER_COMPACT_EVERY``
or once ``LAMBDA_MASTER_COMPACT_COMMITS`` commits landed since its last compaction, whichever
comes first. A compaction commit changes no data (``dataChange = false``): the speed layer skips
it and snapshots at older versions still read the old files, so answers never change.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from batch_layer.errors import BatchLayerError
from batch_layer.master.dataset import MasterDataset

log = logging.getLogger(__name__)

#: How often (seconds) the compactor looks at the master dataset's version.
CHECK_SECONDS = 10.0


@dataclass(frozen=True)
class Compacted:
    """A compaction this process committed: at ``version``, of the table as it was at ``base``."""

    version: int
    base: int


class MasterCompactor:
    """Decides when to compact the master dataset and does it; remembers its last compaction."""

    def __init__(self, master: MasterDataset, *, every_seconds: float | None, every_commits: int,
                 check_seconds: float = CHECK_SECONDS, clock: Callable[[], float] = time.monotonic) -> None:
        self.master = master
        self.every_seconds, self.every_commits, self.check_seconds = every_seconds, every_commits, check_seconds
        self._now = clock
        self.last: Compacted | None = None
        self._since_version: int | None = None  # the version the count of new commits starts at
        self._since_time = self._now()
        self._checked = float("-inf")

    @property
    def enabled(self) -> bool:
        return self.every_seconds is not None or self.every_commits > 0

    def due(self, latest: int) -> bool:
        """Whether a compaction is due with the master dataset at ``latest``."""
        if self._since_version is None:
            self._since_version = latest
        new_commits = latest - self._since_version
        if new_commits <= 0:
            return False
        if self.every_commits and new_commits >= self.every_commits:
            return True
        return self.every_seconds is not None and self._now() - self._since_time >= self.every_seconds

    def maybe_compact(self) -> Compacted | None:
        """Compact when due (looking at most every ``check_seconds``); never raises for a failed compaction."""
        if not self.enabled or self._now() - self._checked < self.check_seconds:
            return None
        self._checked = self._now()
        try:
            if not self.master.holds_data():
                return None
            base = self.master.latest_version()
            if not self.due(base):
                return None
            result = self.master.compact()
        except (BatchLayerError, OSError) as e:
            log.warning("compacting the master dataset failed (tried again later): %s", e)
            return None
        self._since_time = self._now()
        if result.version is None:
            self._since_version = base
            return None
        self._since_version = result.version
        # Only a compaction right after ``base`` tells that nothing but it came after ``base``.
        self.last = Compacted(result.version, base) if result.version == base + 1 else None
        return self.last

    def unchanged_since(self, served: int, latest: int) -> bool:
        """True when the master dataset's data is the same at ``latest`` as at ``served``: the same
        version, or only this process's compaction of the table at ``served`` came after it."""
        return latest == served or (self.last is not None and (self.last.version, self.last.base) == (latest, served))
