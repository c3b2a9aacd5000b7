"""Writing micro-batch increments into realtime segments, exactly once and visible at once.

The increments of every view are encoded in one shape (``encode``), hash-partitioned by row to a
fixed number of partitions and sorted (``write_increments``), so a replayed micro-batch cuts the
very same chunks; a small micro-batch is written by the driver instead, all its increments sorted
as one part named ``driver`` (``write_increments_from_driver``; the speed layer keeps which way a
micro-batch went with its plan). Each chunk's rows are read, merged with their increments here
(``speed_layer.realtime_rows``) and written by one guarded, undo-logged call whose protocol the
store owns (``serving.store.segments``): a replayed chunk is a no-op, and nothing of a micro-batch
is visible until the driver commits it (``serving.store.segment_commits``).

Merging in the writer rather than in Lua spares Redis, the one shared single-threaded part of the
write (``benchmarks/segment_write_bench.py``). Rejected: increments in a pending area merged at
commit (the commit becomes one Lua call as long as the micro-batch, blocking readers, and every
increment is written twice); one undo entry per row with its own tag and no log per window (a
top-N read would then scan every row's entry, where here it reads one window's log, and only
while a micro-batch is in flight).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

import pyarrow as pa
import redis
from redis.commands.core import Script
from redis.exceptions import ClusterError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from tenacity import retry, retry_if_exception_type, stop_after_delay, wait_exponential

from batch_layer.faults import fault_point
from serving.store.columns import key_column, window_column
from serving.store.connection import redis_client, store_keys
from serving.store.keys import Keys
from serving.store.row_format import EXACT_DISTINCT_MAX
from serving.store.segments import (
    EPOCH_CHANGED,
    ROWS_CHANGED,
    SESSION_ROWS,
    MergedRow,
    MicroBatchWrite,
    RowLayout,
    WindowWrite,
    apply_chunk,
    apply_script,
    read_rows,
)
from shared_logic.measures import Count, Max, Measure, Min, Sum
from shared_logic.session_parts import row_bytes
from shared_logic.sessions import SESSIONS_COLUMN, SessionWindow
from shared_logic.views import WINDOW_START, View
from speed_layer.errors import EpochChangedError
from speed_layer.realtime_rows import merge, merge_sessions

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)

VIEW, KEY, WS, DEPTH, VALUE, MEMBER = "_view", "_key", "_ws", "_depth", "_v", "_m"
#: The column a session view's increment (its key's part, JSON) travels in: the first value column.
SESSION_PART = f"{VALUE}0"
#: About the most bytes of session rows one guarded call reads and writes (``WriteSpec.chunk_rows``).
CHUNK_BYTES = 8 * 2**20
_KINDS = {Count: "count", Sum: "sum", Min: "min", Max: "max"}


@dataclass(frozen=True)
class WriteSpec:
    """What an executor needs to apply one micro-batch's increments (picklable)."""

    redis_url: str
    pipeline: str
    query: str
    epoch: str
    batch_id: int
    #: The micro-batch's end offset (its highest master version): the same on every replay.
    tag: int
    bases: tuple[int, ...]
    #: Measure views: view name -> ((measure name, kind) of scalar measures, names of distinct measures)
    #: (``measure_spec``). A session view is in ``sessions`` instead.
    views: dict[str, tuple[tuple[tuple[str, str], ...], tuple[str, ...]]]
    chunk: int
    #: The most distinct values a realtime row keeps exactly (as the batch rows do); above it, a HyperLogLog.
    exact_max: int = EXACT_DISTINCT_MAX
    #: The micro-batch goes on under the tag of one left uncommitted (it ended inside a version): rows that one
    #: wrote are saved in the undo logs already, with their value from before it.
    continues: bool = False
    #: Session views: view name -> its SessionWindow and measures (``session_spec``): their rows are their keys'
    #: parts, merged by the session merge and stored as ``SESSION_ROWS`` (no score, no sketch).
    sessions: dict[str, tuple[SessionWindow, tuple[Measure, ...]]] = field(default_factory=dict)

    def chunk_rows(self, view: str) -> int:
        """Rows one guarded call of ``view`` carries at most: ``chunk``, fewer for a session view, whose rows (read,
        merged and written whole, up to ``max_sessions`` sessions each) then stay within about ``CHUNK_BYTES`` a
        call. Fixed by the view's definition, so a replay cuts the same chunks."""
        session = self.sessions.get(view)
        return self.chunk if session is None else max(1, min(self.chunk, CHUNK_BYTES // row_bytes(*session)))

    def layout(self, view: str) -> RowLayout:
        """What ``view``'s rows carry beside their field, by its kind (``serving.store.segments.RowLayout``)."""
        if view in self.sessions:
            return SESSION_ROWS
        scalars, distinct = self.views[view]
        return RowLayout(tuple(name for name, _ in scalars), distinct)

    @property
    def names(self) -> list[str]:
        """Every view the micro-batch writes: measure views, then session views."""
        return [*self.views, *self.sessions]

    @property
    def micro_batch(self) -> MicroBatchWrite:
        """What each of the micro-batch's calls carries (``serving.store.segments``)."""
        return MicroBatchWrite(self.query, self.batch_id, self.epoch, self.tag, self.continues)


def measure_spec(view: View) -> tuple[tuple[tuple[str, str], ...], tuple[str, ...]]:
    """A measure view's entry of ``WriteSpec.views``; a session view has none (ValueError): see ``session_spec``."""
    if view.sessions is not None:
        raise ValueError(f"view {view.name!r} is a session view: its entry is WriteSpec.sessions (session_spec)")
    scalars = tuple((m.name, _KINDS[type(m)]) for m in view.scalar_measures)
    return scalars, tuple(m.name for m in view.distinct_measures)


def session_spec(view: View) -> tuple[SessionWindow, tuple[Measure, ...]]:
    """A session view's entry of ``WriteSpec.sessions``: its window and measures (what ``merge_sessions`` takes)."""
    if view.sessions is None:
        raise ValueError(f"view {view.name!r} is not a session view: its entry is WriteSpec.views (measure_spec)")
    return view.sessions, view.measures


def widths(views: Sequence[View]) -> tuple[int, int]:
    """(value columns, member columns) of the one shape every view's increments take (``encode``): the most any
    view needs, a session view one value (its key's part)."""
    return (max(1 if v.sessions is not None else len(v.scalar_measures) for v in views),
            max(len(v.distinct_measures) for v in views))


def encode(increments: DataFrame, view: View, width: tuple[int, int]) -> DataFrame:
    """One view's increments (view rows with ``_depth``) in the shape all views share for writing:
    ``width`` = (value columns, member columns), the most any view of the pipeline needs."""
    from pyspark.sql import functions as F

    # Through double, as the batch loader writes them: sorted-set scores are numbers.
    values = [F.col(m.name).cast("double").cast("string") for m in view.scalar_measures]
    members = [F.col(m.name) for m in view.distinct_measures]
    if view.sessions is not None:  # a key's session part, as is: SESSION_PART
        values, members = [F.col(SESSIONS_COLUMN)], []
    values += [F.lit(None).cast("string")] * (width[0] - len(values))
    members += [F.lit(None).cast("array<string>")] * (width[1] - len(members))
    return increments.select(
        F.lit(view.name).alias(VIEW),
        key_column(view.keys).alias(KEY),
        window_column(WINDOW_START if view.window else None).alias(WS),
        F.col(DEPTH),
        *(c.alias(f"{VALUE}{j}") for j, c in enumerate(values)),
        *(c.alias(f"{MEMBER}{j}") for j, c in enumerate(members)),
    )


class Written(NamedTuple):
    """What a micro-batch's write did: the view rows applied, and the longest any writer spent on them
    (reading, merging and the guarded calls, in seconds: what the write adds to the micro-batch's time
    once its increments are computed)."""

    rows: int
    seconds: float


def write_increments(encoded: DataFrame, spec: WriteSpec, partitions: int) -> Written:
    """Apply encoded increments of every view to the segments in one Spark job."""
    from pyspark.sql.pandas.types import from_arrow_schema

    # A fixed partition count and a total order inside each partition make a replayed
    # micro-batch produce the very same chunks, which is what the guard relies on; partitioning by
    # the row keeps each row's increments in one partition, which the undo log relies on.
    stable = encoded.repartition(partitions, VIEW, KEY, WS).sortWithinPartitions(VIEW, KEY, WS, DEPTH)
    parts = stable.mapInArrow(functools.partial(_apply_partition, spec), from_arrow_schema(_WRITTEN)).collect()
    return Written(sum(p.rows for p in parts), max((p.seconds for p in parts), default=0.0))


def write_increments_from_driver(encoded: DataFrame, spec: WriteSpec, client: redis.Redis) -> Written:
    """Apply encoded increments of every view from the driver: one Spark job (the aggregation) fewer than
    ``write_increments``, for a small micro-batch, whose increments the driver holds at little cost.

    The rows are sorted by the same total order (a replay cuts the same chunks) and guarded under
    their own part name, ``driver``: a micro-batch is written one way or the other on every attempt
    (the speed layer records which with the micro-batch's plan)."""
    table = encoded.toArrow().sort_by([(VIEW, "ascending"), (KEY, "ascending"), (WS, "ascending"),
                                       (DEPTH, "ascending")])
    started = time.monotonic()
    rows = apply_rows(spec, table, "driver", client)
    return Written(rows, time.monotonic() - started)


def _runs(views: list[str], chunk: Callable[[str], int]) -> Iterator[tuple[int, int]]:
    """(start, stop) of consecutive rows of one view, at most ``chunk(view)`` long."""
    start = 0
    for i in range(1, len(views) + 1):
        if i == len(views) or views[i] != views[start] or i - start >= chunk(views[start]):
            yield start, i
            start = i


def _by_bucket(keys: Keys, row_keys: list[str], start: int, stop: int) -> dict[int, list[int]]:
    """The rows start..stop grouped by bucket, in row order within each, buckets in ascending order:
    the same grouping on every replay, so the same guarded calls."""
    groups: dict[int, list[int]] = {}
    for i in range(start, stop):
        groups.setdefault(keys.bucket_of(row_keys[i]), []).append(i)
    return dict(sorted(groups.items()))


#: (segment base, window start or None) -> key -> the rows (indexes into the columns) of that key there.
_Windows = dict[tuple[int, int | None], dict[str, list[int]]]


def _windows(spec: WriteSpec, columns: dict[str, list], rows: list[int]) -> _Windows:
    """``rows`` (indexes into ``columns``) by the (segment base, window) they go to, then by key: a row of
    depth d goes to the lowest d bases. First-seen order, so the same on every replay."""
    windows: _Windows = {}
    keys, starts, depths = columns[KEY], columns[WS], columns[DEPTH]
    for r in rows:
        start = int(starts[r]) if starts[r] else None
        for base in spec.bases[:depths[r]]:
            windows.setdefault((base, start), {}).setdefault(keys[r], []).append(r)
    return windows


def _window_writes(spec: WriteSpec, view: str, columns: dict[str, list], windows: _Windows,
                   olds: list[list[bytes | None]]) -> list[WindowWrite]:
    """Each window's rows merged from ``olds`` (their fields as read) with their increments: a session view's by
    the session merge, from ``SESSION_PART``; a measure view's measure by measure."""
    session = spec.sessions.get(view)
    if session is not None:
        parts = columns[SESSION_PART]
        return [WindowWrite(base, start, list(by_key), old,
                            [merge_sessions(before, [parts[r] for r in rs], *session) for before, rs in zip(old, by_key.values())])
                for ((base, start), by_key), old in zip(windows.items(), olds)]
    scalars, distinct = spec.views[view]
    kinds = [kind for _, kind in scalars]
    values = [columns[f"{VALUE}{j}"] for j in range(len(scalars))]
    members = [columns[f"{MEMBER}{j}"] for j in range(len(distinct))]
    writes = []
    for ((base, start), by_key), old in zip(windows.items(), olds):
        merged: list[MergedRow] = [
            merge(before, kinds, [[v[r] for r in rs] for v in values], [[m[r] for r in rs] for m in members],
                  spec.exact_max)
            for before, rs in zip(old, by_key.values())]
        writes.append(WindowWrite(base, start, list(by_key), old, merged))
    return writes


def _apply_partition(spec: WriteSpec, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    from pyspark import TaskContext

    context = TaskContext.get()
    assert context is not None, "_apply_partition runs inside a Spark task (mapInArrow)"
    # A partition's rows arrive sorted; gather them so chunks do not depend on Arrow batch sizes.
    gathered = list(batches)
    started = time.monotonic()
    rows = apply_rows(spec, pa.Table.from_batches(gathered), str(context.partitionId())) if gathered else 0
    # repartition(n) runs a task for every partition, empty ones included: each answers its count.
    yield pa.RecordBatch.from_pydict({"rows": [rows], "seconds": [time.monotonic() - started]}, schema=_WRITTEN)


_WRITTEN = pa.schema([("rows", pa.int64()), ("seconds", pa.float64())])


def apply_rows(spec: WriteSpec, table: pa.Table, part: str, client: redis.Redis | None = None) -> int:
    """Apply ``table``'s encoded increments (sorted by view, key, window, depth) in guarded chunks named
    ``view:part:n``, through ``client`` (else a client of its own); returns the rows applied. The same
    rows in the same order cut the same chunks."""
    keys = store_keys(spec.pipeline, spec.redis_url)
    own = client is None
    client = client or redis_client(spec.redis_url)
    apply = apply_script(client)
    rows, chunk_of = 0, dict.fromkeys(spec.names, 0)
    try:
        columns = {name: table.column(name).to_pylist() for name in table.column_names}
        for start, stop in _runs(columns[VIEW], spec.chunk_rows):
            view = columns[VIEW][start]
            # One guarded call per bucket the chunk's rows fall in (one slot each, on a cluster).
            for b, indexes in _by_bucket(keys, columns[KEY], start, stop).items():
                _apply_chunk(client, apply, keys.bucket(b), spec, view, columns, indexes,
                             f"{view}:{part}:{chunk_of[view]}")
            fault_point("speed-between-chunks")
            chunk_of[view] += 1
            rows += stop - start
    finally:
        if own:
            client.close()
    return rows


class _StaleRows(Exception):
    """The rows changed between reading and writing them: another writer touched them (not expected; see
    ``serving.store.segments.apply_chunk``)."""


@retry(
    retry=retry_if_exception_type(
        (RedisConnectionError, RedisTimeoutError, ConnectionError, ClusterError, TryAgainError, _StaleRows)),
    wait=wait_exponential(multiplier=0.1, max=2.0),
    stop=stop_after_delay(120),
    reraise=True,
)
def _apply_chunk(client: redis.Redis, apply: Script, bucket: Keys, spec: WriteSpec, view: str, columns: dict[str, list],
                 rows: list[int], guard: str) -> None:
    """Read the rows, merge, and write them in one atomic, guarded call in one bucket. Retried on connection
    faults (and a cluster's failover): if a reply was lost, the guard skips the repeat; and when the rows
    changed since they were read, from the reading on."""
    windows = _windows(spec, columns, rows)
    olds = read_rows(client, bucket, view, windows)
    fault_point("speed-after-read")
    result = apply_chunk(apply, bucket, spec.micro_batch, view, guard, spec.layout(view),
                         _window_writes(spec, view, columns, windows, olds))
    if result == EPOCH_CHANGED:
        raise EpochChangedError(
            f"Redis epoch of {spec.pipeline!r} changed (Redis lost its data); the speed layer must rebuild"
        )
    if result == ROWS_CHANGED:
        log.warning("rows of %s changed while %s merged them; reading them again", spec.pipeline, guard)
        raise _StaleRows(guard)
    if result not in (0, 1):
        raise RuntimeError(f"unexpected reply {result!r} applying {guard} of {spec.pipeline!r}")
