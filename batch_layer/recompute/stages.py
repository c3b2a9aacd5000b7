"""The stages of a batch run, reported as they start and end (terminal, run registry, API).

A run goes through ``barrier`` (the master version it covers), ``snapshot`` (the events at that
version), ``dedup`` (only for a pipeline declaring an event id: the duplicates left out), then per view ``gold`` (the shared transform and the view's aggregation, run by the
Spark job that commits the view's gold table: one stage, since Spark runs them as one job) and
``publish`` (the gold rows loaded into Redis beside what is served), and last ``flip`` (the
served generation switches, atomically). Each stage records what it counted.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Literal

log = logging.getLogger(__name__)

StageName = Literal["barrier", "snapshot", "dedup", "gold", "publish", "flip"]
#: What each stage counts.
UNITS: dict[StageName, str] = {
    "barrier": "master version", "snapshot": "events", "dedup": "duplicates", "gold": "rows", "publish": "rows", "flip": "generation",
}


@dataclass
class StageRecord:
    """One stage of a run: running while ``seconds`` is None."""

    name: StageName
    view: str | None
    started_at: float
    seconds: float | None = None
    count: int | None = None

    @property
    def unit(self) -> str:
        return UNITS[self.name]

    def as_dict(self) -> dict[str, str | int | float | None]:
        return {**asdict(self), "unit": self.unit}


StageListener = Callable[[Sequence[StageRecord]], None]


class StageLog:
    """The stages of one run so far; ``listener`` hears every start and end (it must not raise)."""

    def __init__(self, run_id: str, listener: StageListener | None = None) -> None:
        self.run_id, self.listener = run_id, listener
        self.records: list[StageRecord] = []

    @contextmanager
    def stage(self, name: StageName, view: str | None = None) -> Iterator[StageRecord]:
        """Record stage ``name`` around the block; the block sets ``count``. A raising block leaves it running
        (the run's failure is reported by its caller)."""
        record = StageRecord(name, view, time.time())
        self.records.append(record)
        log.info("run %s: %s%s ...", self.run_id, name, f" of {view}" if view else "")
        self._tell()
        started = time.monotonic()
        yield record
        record.seconds = round(time.monotonic() - started, 3)
        log.info("run %s: %s%s done: %s %s in %.1fs", self.run_id, name, f" of {view}" if view else "",
                 "-" if record.count is None else f"{record.count:,}", record.unit, record.seconds)
        self._tell()

    def _tell(self) -> None:
        if self.listener is not None:
            self.listener(list(self.records))
