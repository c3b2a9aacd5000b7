"""Writing micro-batch increments into realtime segments, exactly once and visible at once.

Each chunk of increments is applied by one Lua call that first checks a guard: the highest
micro-batch id applied for (view, partition, chunk) under this streaming query. Spark replays a
failed micro-batch with the same id and the same data, and the increments are hash-partitioned
to a fixed number of partitions and sorted, so a replayed chunk is the same chunk: the guard
makes it a no-op. (A small micro-batch is written by the driver, all its increments sorted as one
part named ``driver``; the speed layer keeps which way a micro-batch went with its plan.) The
same call skips segments below the served generation (they are dead), and
refuses to write at all if Redis's epoch marker is not the one the query started with (Redis
lost its data: the speed layer must rebuild from the served generation instead).

**A micro-batch becomes visible at once.** Its chunks land in many Lua calls from several
executors; between two of them a reader would see it half applied. So each call saves a row's
value before it first changes it in this micro-batch, and readers ignore the change until the
driver commits the micro-batch:

* A micro-batch's *tag* is its end offset, its highest master version: a replay has the same
  offsets, so the same tag. Tags are versions, not batch ids: they only grow, also across
  query restarts (a fresh query wipes the segments anyway). A micro-batch after one left
  uncommitted (it ended inside a version) carries that one's tag: one undo log for both.
* Each (segment, view, window) has an *undo log* (hash: key -> the row's field before the
  micro-batch, '' = none) and its tag (``serving.store.keys``: ``:u``, ``:t``). The first call of a micro-batch to touch a window finds an
  older tag: that micro-batch is committed (they run one after another, each committed before
  the next starts), so the log starts over. A key already in the log was touched earlier in
  this micro-batch: its saved value stays. Which keys those can be follows from the write order,
  so a call looks up one, not all: a row (view, key, window) is in one partition
  (``write_increments`` partitions by it) and its increments (one per depth) are contiguous in
  the sorted rows, so only a call's first row can continue one an earlier call began (when a
  chunk boundary cuts it). Chunks already applied are skipped by the guard on a replay.
  A distinct measure held as a HyperLogLog (null in the row) has it COPYed to ``:p:``; the copies
  are listed beside the log (``:c``) and go when it starts over.
* The commit point is the driver's one MULTI (``SpeedLayer._mark_processed``) setting each
  segment's ``processed`` to the tag. A reader (``serving.store.read_scripts``, one Lua call) reads
  ``processed`` and takes the logged value of every key in a window whose tag is above it: the
  answer is exactly the state at ``processed``.

**Rows are merged by the writer, checked and stored by Redis.** A realtime row is one hash field,
laid out as a batch row (``speed_layer.realtime_rows``), plus one sorted-set entry per scalar
measure for top-N. The task reads the rows a chunk touches, merges the increments in Python and
sends the new fields with a digest of the ones it read; the Lua call refuses the whole chunk if
any changed (then the task reads again), so a merge is never lost to a concurrent writer. Merging
in Lua instead cost Redis, the one shared single-threaded part, 57 us a row against 26.5 here
(``benchmarks/segment_write_bench.py``, fifth write of 100k rows); a row per measure with a
HyperLogLog per row, 70.

Rejected: increments in a pending area merged at commit (the commit becomes one Lua call as
long as the micro-batch, blocking readers, and every increment is written twice); one undo
entry per row with its own tag and no log per window (a top-N read would then scan every row's
entry, where here it reads one window's log, and only while a micro-batch is in flight).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

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
from serving.store.generations import epoch_marker
from serving.store.keys import EXACT_DISTINCT_MAX, LUA_NAMES, Keys, suffix
from shared_logic.measures import Count, Max, Min, Sum
from shared_logic.views import WINDOW_START, View
from speed_layer.errors import EpochChangedError, NonFiniteValueError
from speed_layer.realtime_rows import Merged, merge

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)

VIEW, KEY, WS, DEPTH, VALUE, MEMBER = "_view", "_key", "_ws", "_depth", "_v", "_m"
_KINDS = {Count: "count", Sum: "sum", Min: "min", Max: "max"}

# KEYS: current pointer, guard hash, epoch. ARGV: prefix, view, guard field, batch id, epoch, tag (the
# micro-batch's end version), whether it continues the undo logs of a micro-batch left uncommitted ('1':
# any key may be saved already, each is looked up; '0': only the first), n scalar measures, their
# names..., n distinct measures, their names..., the chunk's first key and window suffix, n windows; then per window: segment base, window suffix,
# n rows, digest of the rows merged from, then columns of n: keys, new row fields, one column of new
# scores per scalar measure ('' = unchanged); then per distinct measure the rows (1-based) whose
# sketch existed before (n, indexes...); then per distinct measure the rows with values for their
# sketches (n, then key, n values, values... of each).
# The call checks that every window's rows are still the ones the caller merged from (their digest:
# SHA-1 of the fields joined by '\n', '' for a row absent) before it writes anything, and answers -2
# if not: the caller reads and merges again. No two writers should touch a row at once (a row is in
# one partition, whose chunks are applied in order, and guarded); the digest makes that a check
# rather than an assumption about Spark's scheduling. Windows of dead segments are skipped. A
# chunk holds at most MAX_CHUNK_ROWS rows so no unpack() exceeds Lua's stack: a script that fails
# midway would leave partial writes that Redis does not roll back.
_APPLY = LUA_NAMES + """
if redis.call('GET', KEYS[3]) ~= ARGV[5] then return -1 end
local batch = tonumber(ARGV[4])
if batch <= tonumber(redis.call('HGET', KEYS[2], ARGV[3]) or '-1') then return 0 end
local current = tonumber(redis.call('GET', KEYS[1]) or '-1')
local p, view, tag = ARGV[1], ARGV[2], ARGV[6]
local continues = ARGV[7] == '1'
local i = 8
local nm = tonumber(ARGV[i]); local names = {}
for j = 1, nm do names[j] = ARGV[i + j] end
i = i + nm + 1
local nd = tonumber(ARGV[i]); local dnames = {}
for j = 1, nd do dnames[j] = ARGV[i + j] end
i = i + nd + 1
local first_key, first_sfx, nw = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
i = i + 3
-- Read every window's layout and check its rows before anything is written.
local windows = {}
for _ = 1, nw do
  local base, sfx, n, digest = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2]), ARGV[i + 3]
  local w = {sp = segment_view(p, base, view), sfx = sfx, n = n, K = i + 3, R = i + 3 + n, S = i + 3 + 2 * n}
  i = w.S + nm * n + 1
  w.sketched = {}
  for j = 1, nd do
    local c, set = tonumber(ARGV[i]), {}
    for t = 1, c do set[tonumber(ARGV[i + t])] = true end
    w.sketched[j] = set
    i = i + c + 1
  end
  w.adds = {}
  for j = 1, nd do
    local list, m = {}, tonumber(ARGV[i])
    i = i + 1
    for _ = 1, m do
      local c = tonumber(ARGV[i + 1])
      list[#list + 1] = {key = ARGV[i], at = i + 2, count = c}
      i = i + 2 + c
    end
    w.adds[j] = list
  end
  if tonumber(base) >= current then
    w.keys = {unpack(ARGV, w.K + 1, w.K + n)}
    w.olds = redis.call('HMGET', rows_key(w.sp, sfx), unpack(w.keys))
    local seen = {}
    for q = 1, n do seen[q] = w.olds[q] or '' end
    if redis.sha1hex(table.concat(seen, '\\n')) ~= digest then return -2 end
    windows[#windows + 1] = w
  end
end
-- The undo log of window `sfx` of segment view `sp` for this micro-batch, and whether it is new (then
-- nothing in it is saved yet). One an earlier micro-batch left is obsolete (that one is committed): it
-- starts over, and the sketches it copied go with it.
local function undo_log(sp, sfx)
  local u, t = undo_key(sp, sfx), undo_tag_key(sp, sfx)
  if redis.call('GET', t) == tag then return u, false end
  local c = undo_copies_key(sp, sfx)
  local stale = redis.call('SMEMBERS', c)
  for q = 1, #stale, 1000 do redis.call('UNLINK', unpack(stale, q, math.min(q + 999, #stale))) end
  redis.call('DEL', u, c)
  redis.call('SET', t, tag)
  return u, true
end
local function each_slice(list, f)
  for q = 1, #list, 1000 do f(unpack(list, q, math.min(q + 999, #list))) end
end
for _, w in ipairs(windows) do
  local sp, sfx, n, keys = w.sp, w.sfx, w.n, w.keys
  local rk = rows_key(sp, sfx)
  -- Save each row as it was before this micro-batch first changes it ('' = none), and a sketch it had.
  -- A key this log already holds was saved by an earlier call of this micro-batch: a row's increments
  -- are contiguous in the chunks' order and in one partition, so only the chunk's first row can be one
  -- (any row, when the micro-batch continues one left uncommitted).
  local u, fresh = undo_log(sp, sfx)
  local kept = {}
  if not fresh and continues then  -- the micro-batch left uncommitted may have saved any of them
    local have = redis.call('HMGET', u, unpack(keys))
    for q = 1, n do if have[q] then kept[keys[q]] = true end end
  elseif not fresh and sfx == first_sfx and redis.call('HEXISTS', u, first_key) == 1 then
    kept[first_key] = true
  end
  local saves, copies, written = {}, {}, {}
  for q = 1, n do
    local key = keys[q]
    if not kept[key] then
      saves[#saves + 1] = key; saves[#saves + 1] = w.olds[q] or ''
      for j = 1, nd do
        if w.sketched[j][q] then
          local before = previous_key(sp, dnames[j], key .. sfx)
          redis.call('COPY', sketch_key(sp, dnames[j], key .. sfx), before, 'REPLACE')
          copies[#copies + 1] = before
        end
      end
    end
    written[#written + 1] = key; written[#written + 1] = ARGV[w.R + q]
  end
  each_slice(saves, function(...) redis.call('HSET', u, ...) end)
  each_slice(copies, function(...) redis.call('SADD', undo_copies_key(sp, sfx), ...) end)
  each_slice(written, function(...) redis.call('HSET', rk, ...) end)
  -- The rankings top-N merges: one sorted set per scalar measure.
  for j = 1, nm do
    local args, col = {}, w.S + (j - 1) * n
    for q = 1, n do
      local s = ARGV[col + q]
      if s ~= '' then args[#args + 1] = s; args[#args + 1] = keys[q] end
    end
    each_slice(args, function(...) redis.call('ZADD', scores_key(sp, names[j], sfx), ...) end)
  end
  for j = 1, nd do
    for _, a in ipairs(w.adds[j]) do
      local hll = sketch_key(sp, dnames[j], a.key .. sfx)
      for s = a.at, a.at + a.count - 1, 1000 do
        redis.call('PFADD', hll, unpack(ARGV, s, math.min(s + 999, a.at + a.count - 1)))
      end
    end
  end
end
redis.call('HSET', KEYS[2], ARGV[3], batch)
return 1
"""


#: The layout realtime segments are written in (a speed-layer checkpoint records it; one of another
#: layout starts over, rebuilding the segments). 2: a hash field per row (before: a HyperLogLog per row).
SEGMENT_LAYOUT = 2

#: Rows per guarded call at most: ZADD takes 2 arguments per row and Lua's unpack() stops near 8000
#: (lists that grow with the distinct measures too, the sketch copies, go in slices).
MAX_CHUNK_ROWS = 3_000


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
    #: view name -> ((measure name, kind) of scalar measures, names of distinct measures)
    views: dict[str, tuple[tuple[tuple[str, str], ...], tuple[str, ...]]]
    chunk: int
    #: The most distinct values a realtime row keeps exactly (as the batch rows do); above it, a HyperLogLog.
    exact_max: int = EXACT_DISTINCT_MAX
    #: The micro-batch goes on under the tag of one left uncommitted (it ended inside a version): rows that one
    #: wrote are saved in the undo logs already, with their value from before it.
    continues: bool = False


def measure_spec(view: View) -> tuple[tuple[tuple[str, str], ...], tuple[str, ...]]:
    scalars = tuple((m.name, _KINDS[type(m)]) for m in view.scalar_measures)
    return scalars, tuple(m.name for m in view.distinct_measures)


def encode(increments: DataFrame, view: View, width: tuple[int, int]) -> DataFrame:
    """One view's increments (view rows with ``_depth``) in the shape all views share for writing:
    ``width`` = (value columns, member columns), the most any view of the pipeline needs."""
    from pyspark.sql import functions as F

    # Through double, as the batch loader writes them: sorted-set scores are numbers.
    values = [F.col(m.name).cast("double").cast("string") for m in view.scalar_measures]
    members = [F.col(m.name) for m in view.distinct_measures]
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


def _runs(views: list[str], chunk: int) -> Iterator[tuple[int, int]]:
    """(start, stop) of consecutive rows of one view, at most ``chunk`` long."""
    start = 0
    for i in range(1, len(views) + 1):
        if i == len(views) or views[i] != views[start] or i - start >= chunk:
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


def _read_rows(client: redis.Redis, bucket: Keys, view: str, windows: _Windows) -> list[list[bytes | None]]:
    """The realtime rows the windows' keys hold now, in one round trip."""
    read = client.pipeline(transaction=False)
    for (base, start), rows in windows.items():
        read.hmget(bucket.segment_rows(base, view, start), list(rows))
    return read.execute()


def _call_args(bucket: Keys, spec: WriteSpec, view: str, columns: dict[str, list], rows: list[int],
               windows: _Windows, olds: list[list[bytes | None]]) -> list:
    """The APPLY arguments writing ``rows`` of ``view`` (all in ``bucket``), merged from ``olds``."""
    scalars, distinct = spec.views[view]
    kinds = [kind for _, kind in scalars]
    first = columns[WS][rows[0]]  # the chunk's first row: the one a chunk boundary may have cut
    args: list = [bucket.prefix, view, "", spec.batch_id, epoch_marker(bucket, spec.epoch), spec.tag,
                  "1" if spec.continues else "0",
                  len(scalars), *(name for name, _ in scalars), len(distinct), *distinct,
                  columns[KEY][rows[0]], suffix(int(first) if first else None), len(windows)]
    values = [columns[f"{VALUE}{j}"] for j in range(len(scalars))]
    members = [columns[f"{MEMBER}{j}"] for j in range(len(distinct))]
    for ((base, start), by_key), old in zip(windows.items(), olds):
        merged = [_merge(view, key, before, kinds, [[v[r] for r in rs] for v in values],
                         [[m[r] for r in rs] for m in members], spec.exact_max)
                  for before, (key, rs) in zip(old, by_key.items())]
        digest = hashlib.sha1(b"\n".join(_as_bytes(b) for b in old)).hexdigest()
        args += [base, suffix(start), len(by_key), digest, *by_key, *(m.row for m in merged)]
        for j in range(len(scalars)):
            args += [m.scores[j] for m in merged]
        for j in range(len(distinct)):
            sketched = [q for q, m in enumerate(merged, 1) if m.sketched[j]]
            args += [len(sketched), *sketched]
        for j in range(len(distinct)):
            adds = [(key, m.sketch_adds[j]) for key, m in zip(by_key, merged) if m.sketch_adds[j]]
            args.append(len(adds))
            for key, values_ in adds:
                args += [key, len(values_), *values_]
    return args


def _merge(view: str, key: str, *args: Any) -> Merged:
    try:
        return merge(*args)
    except NonFiniteValueError as e:
        raise NonFiniteValueError(f"view {view!r}, key {key!r}: {e}") from e


def _as_bytes(field: bytes | str | None) -> bytes:
    return field.encode() if isinstance(field, str) else field or b""


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
    apply = client.register_script(_APPLY)
    rows, chunk_of = 0, dict.fromkeys(spec.views, 0)
    try:
        columns = {name: table.column(name).to_pylist() for name in table.column_names}
        for start, stop in _runs(columns[VIEW], spec.chunk):
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
    ``_APPLY``'s digest)."""


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
    olds = _read_rows(client, bucket, view, windows)
    fault_point("speed-after-read")
    args = _call_args(bucket, spec, view, columns, rows, windows, olds)
    args[2] = guard
    result = apply(keys=[bucket.current, bucket.guard(spec.query), bucket.epoch], args=args)
    if result == -1:
        raise EpochChangedError(
            f"Redis epoch of {spec.pipeline!r} changed (Redis lost its data); the speed layer must rebuild"
        )
    if result == -2:
        log.warning("rows of %s changed while %s merged them; reading them again", spec.pipeline, guard)
        raise _StaleRows(guard)
    if result not in (0, 1):
        raise RuntimeError(f"unexpected reply {result!r} applying {guard} of {spec.pipeline!r}")
