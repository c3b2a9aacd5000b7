"""Publishing a generation: load gold rows into Redis from the executors, then flip the pointer.

Loading writes only keys under ``lp:p:g:{V}:``, which no reader looks at until the flip; the
flip is one Lua call that moves ``lp:p:current`` to V only if V is newer than what is served.
A run that dies before the flip leaves the served generation untouched; its partial keys are
dropped by the next successful publish.

On a bucketed store (Redis Cluster) each bucket's rows are loaded beside its data and the flip
is one such call per bucket, then one on the global pointer. Every bucket is complete before any
pointer names V, so a reader that resolves V in a bucket finds all of V there; a reader of
several buckets (top-N) checks that they answered at the same generation and version, and asks
again when a flip fell between them (``serving.api.view_reader``): it never mixes generations.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
import redis
from redis.typing import EncodableT, FieldT

from batch_layer.errors import PublishError
from serving.store.columns import key_column, window_column
from serving.store.connection import redis_client, store_keys
from serving.store.generations import delete_prefix, epoch_marker, read_epoch, served_generation
from serving.store.keys import EXACT_DISTINCT_MAX, Keys, encode_field, row_parts
from shared_logic.views import WINDOW_START, View

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)

_KEY, _WS = "_key", "_ws"
_FLIP = """
if redis.call('GET', KEYS[3]) ~= ARGV[1] then return -2 end
local current = tonumber(redis.call('GET', KEYS[1]) or '-1')
local generation = tonumber(ARGV[2])
if generation <= current then return current end
redis.call('HSET', KEYS[2], unpack(ARGV, 3))
redis.call('SET', KEYS[1], ARGV[2])
return generation
"""


@dataclass(frozen=True)
class _LoadSpec:
    """What an executor needs to load one view's rows (picklable; no settings object, no clients)."""

    redis_url: str
    pipeline: str
    generation: int
    view: str
    scalars: tuple[str, ...]
    distinct: tuple[str, ...]
    chunk: int


def load_view(rows: DataFrame, view: View, *, pipeline: str, generation: int, redis_url: str, chunk: int) -> int:
    """Write one view's gold rows into Redis under generation ``generation``; returns rows written.

    Key encoding happens in the JVM; the Python workers stream Arrow batches into pipelined HSETs
    of whole rows (one per window per chunk; layout in ``serving.store.keys``), plus a PFADD per row
    only for rows with many distinct values, one connection per partition.
    """
    from pyspark.sql import functions as F

    encoded = rows.select(
        key_column(view.keys).alias(_KEY),
        window_column(WINDOW_START if view.window else None).alias(_WS),
        *(F.col(m.name).cast("double") for m in view.scalar_measures),
        *(F.col(m.name) for m in view.distinct_measures),
    )
    spec = _LoadSpec(
        redis_url, pipeline, generation, view.name,
        tuple(m.name for m in view.scalar_measures), tuple(m.name for m in view.distinct_measures), chunk,
    )
    assert [*spec.scalars, *spec.distinct] == row_parts(view)
    counts = encoded.mapInArrow(functools.partial(_load_partition, spec), "rows long").collect()
    return sum(r.rows for r in counts)


def _load_partition(spec: _LoadSpec, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    keys = store_keys(spec.pipeline, spec.redis_url)
    client = redis_client(spec.redis_url)
    written = 0
    try:
        for batch in batches:
            columns = batch.to_pydict()
            for start in range(0, batch.num_rows, spec.chunk):
                stop = start + spec.chunk
                pipe = client.pipeline(transaction=False)
                _queue_chunk(pipe, keys, spec, {name: col[start:stop] for name, col in columns.items()})
                pipe.execute()
            written += batch.num_rows
    finally:
        client.close()
    yield pa.RecordBatch.from_pydict({"rows": [written]}, schema=pa.schema([("rows", pa.int64())]))


def _queue_chunk(pipe: redis.client.Pipeline, keys: Keys, spec: _LoadSpec, chunk: dict[str, list]) -> None:
    by_window: dict[tuple[Keys, str | None], dict[FieldT, EncodableT]] = {}
    scalars = [chunk[m] for m in spec.scalars]
    distinct = [chunk[m] for m in spec.distinct]
    dumps = functools.partial(json.dumps, ensure_ascii=False, separators=(",", ":"))
    for i, (key, ws) in enumerate(zip(chunk[_KEY], chunk[_WS])):
        bucket = keys.for_key(key)
        parts: list[object] = [column[i] for column in scalars]
        for measure, column in zip(spec.distinct, distinct):
            members = column[i] or []
            if len(members) <= EXACT_DISTINCT_MAX:
                parts.append(members)
            else:
                field = encode_field(key, int(ws) if ws else None)
                pipe.pfadd(bucket.sketch(spec.generation, spec.view, measure, field), *members)
                parts.append(None)
        by_window.setdefault((bucket, ws), {})[key] = dumps(parts)
    for (bucket, ws), mapping in by_window.items():
        pipe.hset(bucket.rows(spec.generation, spec.view, int(ws) if ws else None), mapping=mapping)


def begin(client: redis.Redis, keys: Keys, generation: int, epoch: str) -> None:
    """Record that ``generation`` is being loaded (so a dead run's keys get dropped).

    ``epoch`` is the marker the run read before its barrier; raises PublishError at once when
    Redis lost its data since (the flip would refuse the generation anyway).
    """
    if read_epoch(client, keys) != epoch:
        raise PublishError(f"Redis lost its data after generation {generation} of {keys.pipeline!r} began "
                           "(its epoch marker changed): nothing was loaded; run the batch again")
    client.sadd(keys.generations, generation)


def flip(client: redis.Redis, keys: Keys, generation: int, epoch: str, meta: Mapping[str, object]) -> bool:
    """Serve ``generation`` from now on, atomically, unless a newer one is already served.

    Bucketed: every bucket's pointer first, then the global one (``served_generation``). Refused
    (PublishError) when an epoch marker is not the one in ``epoch``: that Redis lost data during
    the load, so the loaded generation may be incomplete there.
    """
    args: list[EncodableT] = [generation]
    for name, value in {**meta, "version": generation, "published_at": time.time()}.items():
        args += [name, value if isinstance(value, (int, float, str)) else json.dumps(value)]
    served = generation
    for where in reversed(keys.every_prefix()):  # the global pointer last
        try:
            served = int(client.eval(_FLIP, 3, where.current, where.meta(generation), where.epoch,
                                     epoch_marker(where, epoch), *args))
        except redis.RedisError as e:
            raise PublishError(f"cannot flip the served generation of {keys.pipeline!r} to {generation}: {e}") from e
        if served == -2:
            raise PublishError(f"Redis lost its data while generation {generation} of {keys.pipeline!r} was loading "
                               f"(epoch marker {where.epoch} changed); nothing more was flipped: run the batch again")
    return served == generation


def drop_stale(client: redis.Redis, keys: Keys) -> dict[str, list[int]]:
    """Delete every generation and realtime segment older than the served generation.

    Safe while readers and the speed layer run: readers only touch the served generation and its
    segment (atomically, in Lua), and the speed layer's writes skip segments below the pointer.
    """
    served = served_generation(client, keys)
    if served is None:
        return {}
    dropped: dict[str, list[int]] = {}
    for index, kind in ((keys.generations, "g"), (keys.segments, "s")):
        stale = sorted(g for g in (int(x) for x in client.smembers(index)) if g < served)
        for number in stale:
            for where in keys.every_prefix():
                delete_prefix(client, where.generation_prefix(number) if kind == "g" else where.segment_prefix(number))
            client.srem(index, number)
        dropped[index.rsplit(":", 1)[-1]] = stale
    if any(dropped.values()):
        log.info("dropped stale data of %s below generation %d: %s", keys.pipeline, served, dropped)
    return dropped
