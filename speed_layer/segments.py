"""Writing micro-batch increments into realtime segments, exactly once, from the executors.

Each chunk of increments is applied by one Lua call that first checks a guard: the highest
micro-batch id applied for (view, partition, chunk) under this streaming query. Spark replays a
failed micro-batch with the same id and the same data, and the increments are hash-partitioned
to a fixed number of partitions and sorted, so a replayed chunk is the same chunk: the guard
makes it a no-op. The same call skips segments below the served generation (they are dead), and
refuses to write at all if Redis's epoch marker is not the one the query started with (Redis
lost its data: the speed layer must rebuild from the served generation instead).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from tenacity import retry, retry_if_exception_type, stop_after_delay, wait_exponential

from batch_layer.publish import redis_client
from serving.keys import Keys, key_column, window_column
from shared_logic.measures import Count, Max, Min, Sum
from shared_logic.views import WINDOW_START, View

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)

VIEW, KEY, WS, DEPTH, VALUES, MEMBERS = "_view", "_key", "_ws", "_depth", "_values", "_members"
_KINDS = {Count: "count", Sum: "sum", Min: "min", Max: "max"}

# KEYS: current pointer, guard hash, epoch. ARGV: prefix, view, guard field, batch id, epoch,
# n bases, bases..., n scalars, (name, kind)..., n distinct, names..., then rows:
# key, suffix, depth (the row belongs to the lowest `depth` bases), scalar values ('' none),
# per distinct measure: n members, members...
_APPLY = """
if redis.call('GET', KEYS[3]) ~= ARGV[5] then return -1 end
local batch = tonumber(ARGV[4])
if batch <= tonumber(redis.call('HGET', KEYS[2], ARGV[3]) or '-1') then return 0 end
local current = tonumber(redis.call('GET', KEYS[1]) or '-1')
local p, view = ARGV[1], ARGV[2]
local i = 6
local nb = tonumber(ARGV[i]); local live = {}
for j = 1, nb do
  live[j] = (tonumber(ARGV[i + j]) >= current) and (p .. ':s:' .. ARGV[i + j] .. ':' .. view) or false
end
i = i + nb + 1
local nm = tonumber(ARGV[i]); local names, kinds = {}, {}
for j = 1, nm do names[j] = ARGV[i + 2 * j - 1]; kinds[j] = ARGV[i + 2 * j] end
i = i + 2 * nm + 1
local nd = tonumber(ARGV[i]); local dnames = {}
for j = 1, nd do dnames[j] = ARGV[i + j] end
i = i + nd + 1
while i <= #ARGV do
  local key, sfx, depth = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  i = i + 3
  local values = {}
  for j = 1, nm do values[j] = ARGV[i + j - 1] end
  i = i + nm
  local members = {}
  for j = 1, nd do
    local c = tonumber(ARGV[i]); members[j] = {}
    for t = 1, c do members[j][t] = ARGV[i + t] end
    i = i + c + 1
  end
  for s = 1, depth do
    local sp = live[s]
    if sp then
      for j = 1, nm do
        local v = values[j]
        if v ~= '' then
          local z = sp .. ':z:' .. names[j] .. sfx
          if kinds[j] == 'min' then redis.call('ZADD', z, 'LT', v, key)
          elseif kinds[j] == 'max' then redis.call('ZADD', z, 'GT', v, key)
          else redis.call('ZINCRBY', z, v, key) end
        end
      end
      for j = 1, nd do
        local m = members[j]
        for t = 1, #m, 1000 do
          redis.call('PFADD', sp .. ':d:' .. dnames[j] .. ':' .. key .. sfx, unpack(m, t, math.min(t + 999, #m)))
        end
      end
    end
  end
end
redis.call('HSET', KEYS[2], ARGV[3], batch)
return 1
"""


class EpochChangedError(RuntimeError):
    """Redis lost its data under the speed layer: its segments must be rebuilt from the served generation."""


@dataclass(frozen=True)
class WriteSpec:
    """What an executor needs to apply one micro-batch's increments (picklable)."""

    redis_url: str
    pipeline: str
    query: str
    epoch: str
    batch_id: int
    bases: tuple[int, ...]
    #: view name -> ((measure name, kind) of scalar measures, names of distinct measures)
    views: dict[str, tuple[tuple[tuple[str, str], ...], tuple[str, ...]]]
    chunk: int


def measure_spec(view: View) -> tuple[tuple[tuple[str, str], ...], tuple[str, ...]]:
    scalars = tuple((m.name, _KINDS[type(m)]) for m in view.scalar_measures)
    return scalars, tuple(m.name for m in view.distinct_measures)


def encode(increments: DataFrame, view: View) -> DataFrame:
    """One view's increments (view rows with ``_depth``) in the shape every view shares for writing."""
    from pyspark.sql import functions as F

    members = [F.col(m.name) for m in view.distinct_measures]
    return increments.select(
        F.lit(view.name).alias(VIEW),
        key_column(view.keys).alias(KEY),
        window_column(WINDOW_START if view.window else None).alias(WS),
        F.col(DEPTH),
        F.array(*(F.col(m.name).cast("string") for m in view.scalar_measures)).alias(VALUES),
        (F.array(*members) if members else F.array().cast("array<array<string>>")).alias(MEMBERS),
    )


def write_increments(encoded: DataFrame, spec: WriteSpec, partitions: int) -> int:
    """Apply encoded increments of every view to the segments in one Spark job; returns rows applied."""
    # A fixed partition count and a total order inside each partition make a replayed
    # micro-batch produce the very same chunks, which is what the guard relies on.
    stable = encoded.repartition(partitions, VIEW, KEY, WS).sortWithinPartitions(VIEW, KEY, WS, DEPTH)
    counts = stable.mapInArrow(functools.partial(_apply_partition, spec), "rows long").collect()
    return sum(r.rows for r in counts)


def _header(keys: Keys, spec: WriteSpec, view: str) -> list:
    scalars, distinct = spec.views[view]
    head: list = [keys.prefix, view, "", spec.batch_id, spec.epoch, len(spec.bases), *spec.bases, len(scalars)]
    for name, kind in scalars:
        head += [name, kind]
    return head + [len(distinct), *distinct]


def _apply_partition(spec: WriteSpec, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    from pyspark import TaskContext

    partition = TaskContext.get().partitionId()
    keys = Keys(spec.pipeline)
    client = redis_client(spec.redis_url)
    apply = client.register_script(_APPLY)
    rows, chunk_index, view, args = 0, 0, None, []

    def flush() -> None:
        nonlocal rows, chunk_index, args
        if args:
            _apply_chunk(apply, keys, spec, _header(keys, spec, view), f"{view}:{partition}:{chunk_index}", args)
            chunk_index, args = chunk_index + 1, []

    try:
        pending = 0
        for batch in batches:
            columns = batch.to_pydict()
            for i in range(batch.num_rows):
                if columns[VIEW][i] != view or pending >= spec.chunk:
                    flush()
                    if columns[VIEW][i] != view:
                        view, chunk_index = columns[VIEW][i], 0
                    pending = 0
                ws = columns[WS][i]
                args += [columns[KEY][i], f"@{ws}" if ws else "", columns[DEPTH][i]]
                args += ["" if v is None else v for v in columns[VALUES][i]]
                for members in columns[MEMBERS][i]:
                    args += [len(members or ()), *(members or ())]
                pending += 1
                rows += 1
        flush()
    finally:
        client.close()
    yield pa.RecordBatch.from_pydict({"rows": [rows]}, schema=pa.schema([("rows", pa.int64())]))


@retry(
    retry=retry_if_exception_type((RedisConnectionError, RedisTimeoutError, ConnectionError)),
    wait=wait_exponential(multiplier=0.1, max=2.0),
    stop=stop_after_delay(120),
    reraise=True,
)
def _apply_chunk(apply, keys: Keys, spec: WriteSpec, head: list, guard: str, rows: list) -> None:  # noqa: ANN001
    """One atomic, guarded call. Retried on connection faults: if a reply was lost, the guard skips the repeat."""
    head = [*head[:2], guard, *head[3:]]
    result = apply(keys=[keys.current, keys.guard(spec.query), keys.epoch], args=head + rows)
    if result == -1:
        raise EpochChangedError(
            f"Redis epoch of {spec.pipeline!r} changed (Redis lost its data); the speed layer must rebuild"
        )
    if result not in (0, 1):
        raise RuntimeError(f"unexpected reply {result!r} applying {guard} of {spec.pipeline!r}")
