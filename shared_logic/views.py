"""View definitions and the one aggregation both layers run.

A view groups the transformed rows by its key columns (and, for a windowed view, by a tumbling
event-time window) and computes monoid measures per group. The batch layer runs ``aggregate``
over a snapshot; the speed layer runs the very same function over each micro-batch, and the
serving layer combines the two parts with each measure's monoid.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import timedelta

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from shared_logic.errors import PipelineDefinitionError, UnknownNameError
from shared_logic.measures import Derived, Distinct, Measure

_NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
#: Column holding a windowed row's window start (UTC timestamp) in gold tables.
WINDOW_START = "window_start"


@dataclass(frozen=True)
class TumblingWindow:
    """Fixed, non-overlapping event-time windows ``[start, start + size)`` aligned to the Unix epoch (UTC)."""

    size: timedelta
    time_column: str = "event_time"

    def __post_init__(self) -> None:
        seconds = self.size.total_seconds()
        if seconds < 1 or seconds != int(seconds):
            raise PipelineDefinitionError(f"window size must be a whole number of seconds >= 1, got {self.size}")

    @property
    def seconds(self) -> int:
        return int(self.size.total_seconds())

    def start_of(self, epoch_seconds: float) -> int:
        """The start (epoch seconds) of the window holding ``epoch_seconds``."""
        return int(epoch_seconds // self.seconds) * self.seconds

    def column(self) -> Column:
        return F.window(F.col(self.time_column), f"{self.seconds} seconds").start.alias(WINDOW_START)


@dataclass(frozen=True)
class View:
    """A named view: key columns, an optional tumbling window, monoid measures, derived values.

    Guarantee: for any split of the input rows into parts, combining each part's ``aggregate``
    with the measures' monoids gives the ``aggregate`` of all rows. That is what makes the merged
    batch + realtime answer exact.
    """

    name: str
    keys: tuple[str, ...]
    measures: tuple[Measure, ...]
    window: TumblingWindow | None = None
    derived: tuple[Derived, ...] = ()
    description: str = ""
    _by_name: dict[str, Measure] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "keys", tuple(self.keys))
        object.__setattr__(self, "measures", tuple(self.measures))
        object.__setattr__(self, "derived", tuple(self.derived))
        if not _NAME.match(self.name):
            raise PipelineDefinitionError(
                f"view name {self.name!r} must be lower-case letters, digits and '_', starting with a letter"
            )
        if not self.keys:
            raise PipelineDefinitionError(f"view {self.name!r} needs at least one key column")
        if not self.measures:
            raise PipelineDefinitionError(f"view {self.name!r} needs at least one measure")
        names = [m.name for m in self.measures]
        if len(set(names)) != len(names):
            raise PipelineDefinitionError(f"view {self.name!r} declares a measure twice: {names}")
        clash = set(names) & (set(self.keys) | {WINDOW_START})
        if clash:
            raise PipelineDefinitionError(f"view {self.name!r}: measure names {sorted(clash)} clash with key columns")
        for d in self.derived:
            missing = [r for r in d.requires() if r not in names]
            if missing:
                raise PipelineDefinitionError(
                    f"view {self.name!r}: derived value {d.name!r} needs measures {missing}; add them to the view"
                )
        object.__setattr__(self, "_by_name", {m.name: m for m in self.measures})

    @property
    def group_columns(self) -> tuple[str, ...]:
        """Columns identifying one row of the view: the keys, then the window start if windowed."""
        return self.keys + ((WINDOW_START,) if self.window else ())

    @property
    def distinct_measures(self) -> tuple[Measure, ...]:
        return tuple(m for m in self.measures if isinstance(m, Distinct))

    @property
    def scalar_measures(self) -> tuple[Measure, ...]:
        """Measures whose part is one number (everything but HyperLogLog distinct)."""
        return tuple(m for m in self.measures if not isinstance(m, Distinct))

    def measure(self, name: str) -> Measure:
        try:
            return self._by_name[name]
        except KeyError:
            raise UnknownNameError("measure", name, list(self._by_name), owner=f"view {self.name!r}") from None

    def aggregate(self, rows: DataFrame) -> DataFrame:
        """One row per key (and window) with every measure's part. Rows with a null key are dropped."""
        missing = [c for c in self.keys + ((self.window.time_column,) if self.window else ()) if c not in rows.columns]
        if missing:
            raise PipelineDefinitionError(
                f"view {self.name!r} needs columns {missing} that the pipeline's transform does not produce "
                f"(it produces {rows.columns})"
            )
        groups: list[Column] = [F.col(k) for k in self.keys]
        if self.window:
            rows = rows.where(F.col(self.window.time_column).isNotNull())
            groups.append(self.window.column())
        for k in self.keys:
            rows = rows.where(F.col(k).isNotNull())
        return rows.groupBy(*groups).agg(*(m.aggregate() for m in self.measures))
