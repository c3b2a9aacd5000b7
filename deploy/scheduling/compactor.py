"""Keeping the master dataset's file count small while the platform runs (until upkeep has its own home).

Every HTTP ingest is one Delta commit with one small parquet file: demo traffic leaves hundreds of
files a minute, and every commit and every snapshot gets slower with their number. The batch
scheduler therefore compacts the master dataset (OPTIMIZE) every ``LAMBDA_MASTER_COMPACT_EVERY``
or once ``LAMBDA_MASTER_COMPACT_COMMITS`` commits landed since its last compaction, whichever
comes first. A compaction commit changes no data (``dataChange = false``): the speed layer skips
it and snapshots at older versions still read the old files, so answers never change.

After each compaction the master is vacuumed (``MasterDataset.vacuum``: the files compactions removed,
once no version still read needs them and their removal is ``LAMBDA_MASTER_VACUUM_RETENTION_HOURS``
old) and its log is trimmed (``MasterDataset.trim_log``): commit files before
the newest checkpoint at or below the oldest version anyone still reads are deleted. That version is
the lowest of the served generation (its barrier: time travel and the realtime segment start there),
the speed layer's last processed version (it reads every commit after it) and the newest version
less ``LAMBDA_MASTER_LOG_KEEP_VERSIONS``; a recompute starts at a barrier after all of them. With
either version unknown (Redis unreachable, nothing served yet) the log is left alone. Trimming adds
no commit; VACUUM records two commits that change no data, which the scheduler does not count as a
change (``MasterDataset.data_changed``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from batch_layer.errors import BatchLayerError
from batch_layer.master.dataset import MasterDataset
from batch_layer.master.delta_log import LogTrim
from batch_layer.master.vacuum import Vacuumed

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
                 check_seconds: float = CHECK_SECONDS, clock: Callable[[], float] = time.monotonic,
                 needed: Callable[[], int | None] | None = None, keep_versions: int = 1_000,
                 vacuum_hours: float | None = None) -> None:
        self.master = master
        self.every_seconds, self.every_commits, self.check_seconds = every_seconds, every_commits, check_seconds
        self._now = clock
        #: The oldest master version a reader still needs (None: unknown, do not trim); no trimming without it.
        self.needed, self.keep_versions, self.vacuum_hours = needed, keep_versions, vacuum_hours
        self.last: Compacted | None = None
        self.compacted_at: int | None = None  # the version of this process's last compaction commit
        #: The last log trim and what it kept from (for ``summary``).
        self.last_trim: tuple[LogTrim, int] | None = None
        self.last_vacuum: Vacuumed | None = None
        self.last_error: str | None = None
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
            self.last_error = f"compaction failed: {e}"
            return None
        self._since_time = self._now()
        self.last_error = None
        self._trim(result.version if result.version is not None else base)
        if result.version is None:
            self._since_version = base
            return None
        self._since_version = self.compacted_at = result.version
        self.last = Compacted(result.version, base)
        return self.last

    def _trim(self, latest: int) -> None:
        """Trim the log to the oldest version still needed; never raises (a failure is logged and shown)."""
        if self.needed is None:
            return
        try:
            needed = self.needed()
            if needed is None:
                log.debug("master log not trimmed: the oldest version still needed is unknown")
                return
            keep_from = max(0, min(needed, latest - self.keep_versions))
            if self.vacuum_hours is not None:  # first: it reads the commit after keep_from, which the trim keeps anyway
                self.last_vacuum = self.master.vacuum(keep_from, floor_hours=self.vacuum_hours)
            self.last_trim = (self.master.trim_log(keep_from), keep_from)
        except (BatchLayerError, OSError) as e:
            log.warning("vacuum or log trim of the master dataset failed (tried again after the next compaction): %s", e)
            self.last_error = f"vacuum or log trim failed: {e}"

    def summary(self) -> str | None:
        """One line on this process's last upkeep of the master dataset (for ``status`` and the console)."""
        parts = []
        if self.compacted_at is not None:
            parts.append(f"compacted at version {self.compacted_at}")
        if self.last_vacuum is not None:
            parts.append(f"vacuum deleted {self.last_vacuum.files_deleted} files (retention "
                         f"{self.last_vacuum.retention_hours} h)")
        if self.last_trim is not None:
            trim, keep_from = self.last_trim
            parts.append(f"log keeps every version from {keep_from}" + (
                f" (starts at the checkpoint of version {trim.starts_at}; {trim.deleted} files deleted last time)"
                if trim.starts_at is not None else " (no checkpoint below it yet: nothing deleted)"))
        if self.last_error:
            parts.append(self.last_error)
        return "; ".join(parts) or None
