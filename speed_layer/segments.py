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
  query restarts (a fresh query wipes the segments anyway).
* Each (segment, view, window) has an *undo log* (hash: key -> the row's parts before the
  micro-batch: its scores, '' = none, and per distinct measure whether its sketch was copied)
  and its tag (``serving.store.keys``: ``:u``, ``:t``): one entry per row, not per measure, as a
  row's measures change together. The first call of a micro-batch to touch a window finds an
  older tag: that micro-batch is committed (they run one after another, each committed before
  the next starts), so the log starts over. A key already in the log was touched earlier in
  this micro-batch: its saved value stays. Which keys those can be follows from the write order,
  so a call looks up one, not all: a row (view, key, window) is in one partition
  (``write_increments`` partitions by it) and its increments (one per depth) are contiguous in
  the sorted rows, so only a call's first row can continue one an earlier call began (when a
  chunk boundary cuts it). Chunks already applied are skipped by the guard on a replay.
  Distinct measures COPY the row's HyperLogLog to ``:p:`` (its part '1'); the copies are listed
  beside the log (``:c``) and go when it starts over.
* The commit point is the driver's one MULTI (``SpeedLayer._mark_processed``) setting each
  segment's ``processed`` to the tag. A reader (``serving.store.read_scripts``, one Lua call) reads
  ``processed`` and takes the logged value of every key in a window whose tag is above it: the
  answer is exactly the state at ``processed``.

Rejected: increments in a pending area merged at commit (the commit becomes one Lua call as
long as the micro-batch, blocking readers, and every increment is written twice); one undo
entry per row with its own tag and no log per window (a top-N read would then scan every row's
entry, where here it reads one window's log, and only while a micro-batch is in flight).
"""

from __future__ import annotations

import functools
import itertools
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
import redis
from redis.exceptions import ClusterError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from tenacity import retry, retry_if_exception_type, stop_after_delay, wait_exponential

from batch_layer.faults import fault_point
from serving.store.columns import key_column, window_column
from serving.store.connection import redis_client, store_keys
from serving.store.generations import epoch_marker
from serving.store.keys import LUA_NAMES, WINDOW_SEPARATOR, Keys
from shared_logic.measures import Count, Max, Min, Sum
from shared_logic.views import WINDOW_START, View
from speed_layer.errors import EpochChangedError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)

VIEW, KEY, WS, DEPTH, VALUE, MEMBER = "_view", "_key", "_ws", "_depth", "_v", "_m"
_KINDS = {Count: "count", Sum: "sum", Min: "min", Max: "max"}

# KEYS: current pointer, guard hash, epoch. ARGV: prefix, view, guard field, batch id, epoch, tag
# (the micro-batch's end version), n bases, bases..., n scalars, (name, kind)..., n distinct,
# names..., n rows, then columns of n values each: keys, window suffixes, depths (a row belongs to
# the lowest `depth` bases), one column per scalar measure ('' = none), one column of member counts
# per distinct measure; then all members. Rows are grouped by (segment, window), then written with
# one ZMSCORE + one ZADD per sorted set; numbers are formatted %.17g so no digit of a sum is lost.
# Before a row's parts first change in this micro-batch, they are saved in the undo log of its
# (segment, window) under the tag (see the module docstring). A chunk holds at most
# MAX_CHUNK_ROWS rows so no unpack() exceeds Lua's stack: a script that fails midway would leave
# partial writes that Redis does not roll back.
_APPLY = LUA_NAMES + """
if redis.call('GET', KEYS[3]) ~= ARGV[5] then return -1 end
local batch = tonumber(ARGV[4])
if batch <= tonumber(redis.call('HGET', KEYS[2], ARGV[3]) or '-1') then return 0 end
local current = tonumber(redis.call('GET', KEYS[1]) or '-1')
local p, view, tag = ARGV[1], ARGV[2], ARGV[6]
local i = 7
local nb = tonumber(ARGV[i]); local live = {}
for j = 1, nb do
  live[j] = (tonumber(ARGV[i + j]) >= current) and segment_view(p, ARGV[i + j], view) or false
end
i = i + nb + 1
local nm = tonumber(ARGV[i]); local names, kinds = {}, {}
for j = 1, nm do names[j] = ARGV[i + 2 * j - 1]; kinds[j] = ARGV[i + 2 * j] end
i = i + 2 * nm + 1
local nd = tonumber(ARGV[i]); local dnames = {}
for j = 1, nd do dnames[j] = ARGV[i + j] end
i = i + nd + 1
local n = tonumber(ARGV[i])
local K, S, D = i, i + n, i + 2 * n
local V = i + 3 * n
local C = V + nm * n
-- Where row r's members of distinct measure j start in ARGV.
local mstart, m = {}, C + nd * n + 1
for j = 1, nd do
  local st = {}
  for r = 1, n do st[r] = m; m = m + tonumber(ARGV[C + (j - 1) * n + r]) end
  mstart[j] = st
end
-- The windows this call writes, (live segment, window suffix), in first-seen order: their keys, each
-- key's rows (one per depth reaching that segment).
local by_segment, windows = {}, {}
for s = 1, nb do by_segment[s] = {} end
for r = 1, n do
  local key, sfx, depth = ARGV[K + r], ARGV[S + r], tonumber(ARGV[D + r])
  for s = 1, depth do
    local sp = live[s]
    if sp then
      local w = by_segment[s][sfx]
      if not w then w = {sp = sp, sfx = sfx, keys = {}, rows = {}}; by_segment[s][sfx] = w; windows[#windows + 1] = w end
      local rows = w.rows[key]
      if rows then rows[#rows + 1] = r else w.keys[#w.keys + 1] = key; w.rows[key] = {r} end
    end
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
-- A key an older log of this micro-batch already holds: earlier calls wrote other rows (a row's
-- increments are contiguous in the chunks' order, a row is in one partition), save the one a chunk
-- boundary cut, which is this call's first row: only that one is looked up.
local first_key, first_sfx = ARGV[K + 1], ARGV[S + 1]
local function saved_before(u, fresh, w)
  if fresh or w.sfx ~= first_sfx or not w.rows[first_key] then return nil end
  return redis.call('HEXISTS', u, first_key) == 1 and first_key or nil
end
for _, w in ipairs(windows) do
  local sp, sfx, keys, rows = w.sp, w.sfx, w.keys, w.rows
  local zs, old = {}, {}
  for j = 1, nm do
    zs[j] = scores_key(sp, names[j], sfx)
    old[j] = redis.call('ZMSCORE', zs[j], unpack(keys))
  end
  -- Save each row's parts before this micro-batch first changes them: scores ('' = none), then per
  -- distinct measure '1' (its sketch copied to previous_key) or '' (none).
  local u, fresh = undo_log(sp, sfx)
  local skip = saved_before(u, fresh, w)
  local saves, copies = {}, {}
  for q = 1, #keys do
    local key = keys[q]
    if key ~= skip then
      local entry = {}
      for j = 1, nm do entry[j] = old[j][q] or '' end
      for j = 1, nd do
        local before = previous_key(sp, dnames[j], key .. sfx)
        if redis.call('COPY', sketch_key(sp, dnames[j], key .. sfx), before, 'REPLACE') == 1 then
          entry[nm + j] = '1'; copies[#copies + 1] = before
        else
          entry[nm + j] = ''
        end
      end
      saves[#saves + 1] = key; saves[#saves + 1] = cjson.encode(entry)
    end
  end
  if #saves > 0 then redis.call('HSET', u, unpack(saves)) end
  -- One copy per row and distinct measure: more than unpack() takes at once with several of them.
  for q = 1, #copies, 1000 do
    redis.call('SADD', undo_copies_key(sp, sfx), unpack(copies, q, math.min(q + 999, #copies)))
  end
  -- Then apply the increments: per scalar measure one ZADD of the window's rows.
  for j = 1, nm do
    local kind, args, col = kinds[j], {}, V + (j - 1) * n
    for q = 1, #keys do
      local acc = nil
      for _, r in ipairs(rows[keys[q]]) do
        local v = ARGV[col + r]
        if v ~= '' then
          local x = tonumber(v)
          if acc == nil then acc = x
          elseif kind == 'min' then if x < acc then acc = x end
          elseif kind == 'max' then if x > acc then acc = x end
          else acc = acc + x end
        end
      end
      if acc ~= nil then
        if (kind == 'count' or kind == 'sum') and old[j][q] then acc = acc + tonumber(old[j][q]) end
        args[#args + 1] = string.format('%.17g', acc); args[#args + 1] = keys[q]
      end
    end
    if #args > 0 then
      if kind == 'min' then redis.call('ZADD', zs[j], 'LT', unpack(args))
      elseif kind == 'max' then redis.call('ZADD', zs[j], 'GT', unpack(args))
      else redis.call('ZADD', zs[j], unpack(args)) end
    end
  end
  for j = 1, nd do
    for q = 1, #keys do
      local hll = sketch_key(sp, dnames[j], keys[q] .. sfx)
      for _, r in ipairs(rows[keys[q]]) do
        local c, st = tonumber(ARGV[C + (j - 1) * n + r]), mstart[j][r]
        for a = st, st + c - 1, 1000 do redis.call('PFADD', hll, unpack(ARGV, a, math.min(a + 999, st + c - 1))) end
      end
    end
  end
end
redis.call('HSET', KEYS[2], ARGV[3], batch)
return 1
"""


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


def write_increments(encoded: DataFrame, spec: WriteSpec, partitions: int) -> int:
    """Apply encoded increments of every view to the segments in one Spark job; returns rows applied."""
    # A fixed partition count and a total order inside each partition make a replayed
    # micro-batch produce the very same chunks, which is what the guard relies on; partitioning by
    # the row keeps each row's increments in one partition, which the undo log relies on.
    stable = encoded.repartition(partitions, VIEW, KEY, WS).sortWithinPartitions(VIEW, KEY, WS, DEPTH)
    counts = stable.mapInArrow(functools.partial(_apply_partition, spec), "rows long").collect()
    return sum(r.rows for r in counts)


def write_increments_from_driver(encoded: DataFrame, spec: WriteSpec, client: redis.Redis) -> int:
    """Apply encoded increments of every view from the driver: one Spark job (the aggregation) fewer than
    ``write_increments``, for a small micro-batch, whose increments the driver holds at little cost.

    The rows are sorted by the same total order (a replay cuts the same chunks) and guarded under
    their own part name, ``driver``: a micro-batch is written one way or the other on every attempt
    (the speed layer records which with the micro-batch's plan)."""
    table = encoded.toArrow().sort_by([(VIEW, "ascending"), (KEY, "ascending"), (WS, "ascending"),
                                       (DEPTH, "ascending")])
    return apply_rows(spec, table, "driver", client)


def _header(keys: Keys, spec: WriteSpec, view: str) -> list:
    scalars, distinct = spec.views[view]
    head: list = [keys.prefix, view, "", spec.batch_id, epoch_marker(keys, spec.epoch), spec.tag, len(spec.bases),
                  *spec.bases, len(scalars)]
    for name, kind in scalars:
        head += [name, kind]
    return head + [len(distinct), *distinct]


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


def _call_args(bucket: Keys, spec: WriteSpec, view: str, columns: dict[str, list], rows: list[int]) -> list:
    """The APPLY arguments for ``rows`` (indexes into ``columns``) of ``view``, all in ``bucket``."""
    scalars, distinct = spec.views[view]
    args = _header(bucket, spec, view) + [len(rows)]
    args += [columns[KEY][i] for i in rows]
    args += [WINDOW_SEPARATOR + columns[WS][i] if columns[WS][i] else "" for i in rows]
    args += [columns[DEPTH][i] for i in rows]
    for j in range(len(scalars)):
        values = columns[f"{VALUE}{j}"]
        args += ["" if values[i] is None else values[i] for i in rows]
    member_lists = [[columns[f"{MEMBER}{j}"][i] or () for i in rows] for j in range(len(distinct))]
    for lists in member_lists:
        args += [len(m) for m in lists]
    for lists in member_lists:
        args += list(itertools.chain.from_iterable(lists))
    return args


def _apply_partition(spec: WriteSpec, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    from pyspark import TaskContext

    context = TaskContext.get()
    assert context is not None, "_apply_partition runs inside a Spark task (mapInArrow)"
    # A partition's rows arrive sorted; gather them so chunks do not depend on Arrow batch sizes.
    gathered = list(batches)
    rows = apply_rows(spec, pa.Table.from_batches(gathered), str(context.partitionId())) if gathered else 0
    # repartition(n) runs a task for every partition, empty ones included: each answers its count.
    yield pa.RecordBatch.from_pydict({"rows": [rows]}, schema=pa.schema([("rows", pa.int64())]))


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
                bucket = keys.bucket(b)
                args = _call_args(bucket, spec, view, columns, indexes)
                _apply_chunk(apply, bucket, spec, args, f"{view}:{part}:{chunk_of[view]}")
            fault_point("speed-between-chunks")
            chunk_of[view] += 1
            rows += stop - start
    finally:
        if own:
            client.close()
    return rows


@retry(
    retry=retry_if_exception_type(
        (RedisConnectionError, RedisTimeoutError, ConnectionError, ClusterError, TryAgainError)),
    wait=wait_exponential(multiplier=0.1, max=2.0),
    stop=stop_after_delay(120),
    reraise=True,
)
def _apply_chunk(apply, bucket: Keys, spec: WriteSpec, args: list, guard: str) -> None:
    """One atomic, guarded call in one bucket. Retried on connection faults (and a cluster's failover):
    if a reply was lost, the guard skips the repeat."""
    args[2] = guard
    result = apply(keys=[bucket.current, bucket.guard(spec.query), bucket.epoch], args=args)
    if result == -1:
        raise EpochChangedError(
            f"Redis epoch of {spec.pipeline!r} changed (Redis lost its data); the speed layer must rebuild"
        )
    if result not in (0, 1):
        raise RuntimeError(f"unexpected reply {result!r} applying {guard} of {spec.pipeline!r}")
