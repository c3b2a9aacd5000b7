"""The speed layer's side of the duplicates rule (``shared_logic.dedup``).

The rule decides a version's occurrences from the occurrences before it, back one horizon. The speed
layer keeps them in process: each id's newest clock, for the ids seen within the horizon, and how far
that reaches. It is rebuilt from the event-id index (``batch_layer.master.event_ids``, written by
batch runs) and the master's change data feed after it, whenever a micro-batch does not start right
after what it holds: at start, on a replayed micro-batch, after the index was seeded anew. Versions
the index reaches are read from it, not from the micro-batch: a seeded index takes older versions as
one, and the batch layer reads them so too.

Memory: about (150 + id length) bytes per id seen within the horizon (a Python dict entry).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from batch_layer.master.arrow_frames import spark_frame
from batch_layer.master.delta_log import inserted_rows, read_commit
from batch_layer.master.event_ids import FEED_CHUNK_ROWS, FEED_CHUNK_VERSIONS, EventIdIndex, IndexState, clock_of
from shared_logic.dedup import CLOCK, ID, KEY, ROW_KEY, ROWS, VERSION, candidates, counted, keep, with_key
from shared_logic.events import KIND_COLUMN
from speed_layer.errors import SpeedLayerError
from speed_layer.source import VERSION_COLUMN

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)

#: How long a micro-batch waits in process for the index to reach its base before the query is started again.
_WAIT_SECONDS = 60.0
_OCCURRENCE = pa.schema([pa.field(ID, pa.string()), pa.field(VERSION, pa.int64()), pa.field(CLOCK, pa.int64()),
                         pa.field(KEY, pa.string())])


class EventIdsUnreadableError(SpeedLayerError):
    """The horizon before a micro-batch cannot be read yet: the event-id index does not reach a version the
    micro-batch needs from it, or the log no longer holds one it does not reach. The batch run extends (or
    seeds) the index; the runner starts the query again (``speed_layer.runner._TRANSIENT``), a failure to see
    when the log was trimmed past the index (the next batch run brings it back)."""


class IndexBehindError(EventIdsUnreadableError):
    """A micro-batch waited its while for the batch run bringing the index to its base (a wait, not a failure)."""


class Horizon:
    """What the speed layer remembers of the horizon, and the rule applied to its micro-batches.

    ``may_seed`` says whether a batch run may still seed the index (no generation of this logic is served:
    ``EventIdIndex.extend``)."""

    def __init__(self, index: EventIdIndex, horizon: timedelta, may_seed: Callable[[], bool]) -> None:
        self.index, self.horizon, self._may_seed = index, horizon, may_seed
        self._span = int(horizon.total_seconds() * 1_000_000)
        self._last: dict[str, int] = {}  # id -> clock of its newest occurrence
        self._through: int | None = None  # versions 0.._through are folded in
        self._clock = 0  # the clock of version _through
        self._seed: int | None = None  # the index's seed they were read under
        self._pruned_at = 0

    def screen(self, events: DataFrame, first: int | None, last: int, *, base: int,
               wait: Callable[[str], None]) -> tuple[DataFrame, int]:
        """``events`` (with ``_version``) as the views read them, and how many duplicates were left out.
        ``first`` is the micro-batch's first version when known (else its first holding an occurrence);
        ``base`` the lowest segment base it writes; ``wait`` is called while the index is not ready (see
        :meth:`_ready`)."""
        field = self.index.id_field
        keyed = with_key(events, [c for c in events.columns if c != VERSION_COLUMN])
        every = candidates(keyed, field, VERSION_COLUMN).toArrow()
        if every.num_rows == 0:
            return keyed.drop(ROW_KEY), 0
        state = self._ready(base, wait)
        # Rows at or below the lowest base reach no segment: those versions are only remembered, not decided; nor
        # are versions at or below a seed, which only segments no generation of this logic will serve hold.
        start = max(first if first is not None else int(pc.min(every[VERSION]).as_py()), base + 1, state.seed + 1)
        self._catch_up(state, start - 1)
        mine = every.filter(pc.greater_equal(every[VERSION], start))
        occurrences, clock = self._with_clocks(mine.filter(pc.greater(mine[VERSION], state.through)), state, start,
                                               last)
        ids = [i for i in set(occurrences[ID].to_pylist()) if i in self._last]
        priors = pa.table({ID: pa.array(ids, pa.string()), VERSION: pa.array([-1] * len(ids), pa.int64()),
                           CLOCK: pa.array([self._last[i] for i in ids], pa.int64()),
                           KEY: pa.nulls(len(ids), pa.string())}, schema=_OCCURRENCE)
        spark = events.sparkSession
        kept = counted(spark_frame(spark, pa.concat_tables([occurrences, priors])), self.horizon)
        chosen = kept.where(kept[VERSION] >= 0).select(ID, VERSION, KEY).toArrow()
        self._fold(occurrences, max(last, start - 1))
        self._clock = max(self._clock, clock)
        dropped = int(pc.sum(mine[ROWS]).as_py() or 0) - chosen.num_rows
        if dropped < 0:  # a kept occurrence whose row is not in the micro-batch: a bug to see, not to count
            log.warning("micro-batch through version %d: %d occurrences kept without a row", last, -dropped)
            dropped = 0
        return keep(keyed, spark_frame(spark, chosen), field, by=(VERSION_COLUMN,)), dropped

    def _ready(self, base: int, wait: Callable[[str], None]) -> IndexState:
        """The index's state once it reaches ``base``; or once it exists, when no run can seed it any more (a
        generation of this logic is served: such a run never seeds, ``EventIdIndex.extend``).

        A batch run may seed the index at its barrier; the versions at or below a segment's base must then be
        taken as that run's index says, so the speed layer waits for the run whose barrier is ``base``
        (``_WAIT_SECONDS`` in process, heartbeating why, then IndexBehindError: the query starts again and waits on)."""
        deadline = time.monotonic() + _WAIT_SECONDS
        while True:
            state = self.index.state()
            if state is not None and (state.through >= base or not self._may_seed()):
                return state
            reason = (f"waiting for the event-id index at {self.index.path} to reach master version {base}: the batch "
                      "run whose barrier it is builds it (if runs fail with EventIdIndexError, follow its remedy)")
            if time.monotonic() > deadline:
                raise IndexBehindError(reason)
            wait(reason)

    def _with_clocks(self, found: pa.Table, state: IndexState, first: int, last: int) -> tuple[pa.Table, int]:
        """The micro-batch's occurrences with their clocks (from the index at versions it reaches; ``found`` holds
        the others, from the rows), and the clock of version ``last``."""
        clocks: dict[int, int] = {}
        clock = self._clock if first > state.through else state.clock
        for version in range(max(first, state.through + 1), last + 1):
            commit = read_commit(self.index.master.path, version)
            if commit is None:
                raise EventIdsUnreadableError(f"master version {version} is not in the log")
            clock = clocks[version] = clock_of(commit.timestamp, clock)
        own = found.select([ID, VERSION, KEY]).append_column(
            CLOCK, pa.array([clocks[v] for v in found[VERSION].to_pylist()], pa.int64())).select(_OCCURRENCE.names)
        if first > state.through:
            return own.cast(_OCCURRENCE), clock
        indexed = self.index.rows(first=first, last=min(last, state.through)).select(_OCCURRENCE.names)
        if last <= state.through:
            clock = self.index.clock_at(last)
        return pa.concat_tables([indexed.cast(_OCCURRENCE), own.cast(_OCCURRENCE)]), clock

    def _catch_up(self, state: IndexState, target: int) -> None:
        """Hold versions up to ``target``: fold in those after what is held, or read all again when what is
        held is past ``target`` (a replay) or was read under another seed. Versions the index reaches are
        read from it, later ones from the change data feed."""
        full = self._through is None or self._seed != state.seed or self._through > target
        if full:
            log.info("reading the event-id horizon before master version %d", target + 1)
            self._last, self._through, self._clock, self._seed = {}, 0, 0, state.seed
        assert self._through is not None
        high = min(target, state.through)
        if self._through < high:
            clock = self.index.clock_at(high)
            since = clock - self._span if full else None
            self._fold(self.index.rows(first=self._through + 1, last=high, since_clock=since), high)
            self._clock = clock
        if self._through < target:
            self._changes(self._through + 1, target)

    def _changes(self, first: int, last: int) -> None:
        """Fold in versions ``first..last`` from the master's change data feed (the id and kind columns only), in
        runs of versions adding about ``FEED_CHUNK_ROWS`` rows."""
        master, field = self.index.master, self.index.id_field
        schema = pa.schema([master.schema.field(KIND_COLUMN), master.schema.field(field),
                            pa.field(VERSION_COLUMN, pa.int64())])
        clocks: dict[int, int] = {}
        clock, rows, low = self._clock, 0, first
        for version in range(first, last + 1):
            commit = read_commit(master.path, version)
            if commit is None:
                raise EventIdsUnreadableError(f"master version {version} is not in the log and the event-id index "
                                              "does not reach it yet: the next batch run extends it")
            clock = clocks[version] = clock_of(commit.timestamp, clock)
            rows += commit.rows_added
            if rows >= FEED_CHUNK_ROWS or version - low + 1 >= FEED_CHUNK_VERSIONS or version == last:
                read = pa.Table.from_batches(list(inserted_rows(master.path, low, version, schema, version_column=VERSION_COLUMN,
                                                                project=True)), schema=schema)
                read = read.filter(pc.and_(pc.equal(read[KIND_COLUMN], "event"), pc.is_valid(read[field])))
                versions = read[VERSION_COLUMN].to_pylist()
                self._fold(pa.table({ID: read[field].cast(pa.string()), VERSION: pa.array(versions, pa.int64()),
                                     CLOCK: pa.array([clocks[v] for v in versions], pa.int64())}), version)
                self._clock = max(self._clock, clock)
                rows, low = 0, version + 1

    def _fold(self, occurrences: pa.Table, through: int) -> None:
        """Remember ``occurrences`` (in version order) as each id's newest, through version ``through``."""
        last = self._last
        for ident, clock in zip(occurrences[ID].to_pylist(), occurrences[CLOCK].to_pylist()):
            if ident is not None and clock >= last.get(ident, clock):
                last[ident] = clock
        if occurrences.num_rows:
            self._clock = max(self._clock, int(pc.max(occurrences[CLOCK]).as_py()))
        self._through = through
        if self._clock - self._pruned_at > self._span // 8:  # forget ids out of the horizon, now and then
            floor = self._clock - self._span
            self._last = {i: c for i, c in last.items() if c >= floor}
            self._pruned_at = self._clock
