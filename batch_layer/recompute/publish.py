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

import numpy as np
import pyarrow as pa
import redis
from redis.typing import EncodableT

from batch_layer.errors import PublishError
from serving.store import hyperloglog, packed
from serving.store.columns import bucket_name_column, key_column, row_value_column, suffix_column
from serving.store.connection import redis_client, store_keys
from serving.store.generations import delete_prefix, epoch_marker, read_epoch, served_generation
from serving.store.keys import EXACT_DISTINCT_MAX, Keys
from shared_logic.views import WINDOW_START, View

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

log = logging.getLogger(__name__)

_FLIP = """
if redis.call('GET', KEYS[3]) ~= ARGV[1] then return -2 end
local current = tonumber(redis.call('GET', KEYS[1]) or '-1')
local generation = tonumber(ARGV[2])
if generation <= current then return current end
redis.call('HSET', KEYS[2], unpack(ARGV, 3))
redis.call('SET', KEYS[1], ARGV[2])
return generation
"""


_HASH, _ENTRY, _SKETCH, _MEMBERS = "_hash", "_entry", "_sketch", "_members"


@dataclass(frozen=True)
class _LoadSpec:
    """What an executor needs to load one view's rows (picklable; no settings object, no clients)."""

    redis_url: str
    view: str
    chunk: int
    distinct: int


def load_view(rows: DataFrame, view: View, *, pipeline: str, generation: int, redis_url: str, chunk: int) -> int:
    """Write one view's gold rows into Redis under generation ``generation``; returns rows written.

    The JVM spells each row's share of the commands (``serving.store.packed``): its rows-hash name,
    its field and value (the layout in ``serving.store.keys``), and for each distinct measure with
    more values than the exact list keeps, its sketch's name and the values. The Python workers
    group rows by hash and send the JVM's buffers as they are, one HSET per hash and at most
    ``chunk`` rows, and build those sketches themselves (``serving.store.hyperloglog``), one SET
    each: one connection and one write per Arrow batch and node.
    """
    from pyspark.sql import functions as F

    keys = store_keys(pipeline, redis_url)
    key = key_column(view.keys)
    window = suffix_column(WINDOW_START if view.window else None)
    wide: list[Column] = []
    for i, measure in enumerate(view.distinct_measures):
        values = F.col(measure.name)
        over = F.size(values) > EXACT_DISTINCT_MAX
        prefix = functools.partial(_sketch_prefix, generation=generation, view=view.name, measure=measure.name)
        # Empty, not null, for the rest: Spark 4.2's Arrow writer took 15x as long over an array
        # column of nulls (11.5 against 0.8 s for 1.2M rows).
        wide += [F.when(over, F.concat(bucket_name_column(keys, key, prefix), key, window)).alias(f"{_SKETCH}{i}"),
                 F.when(over, values).otherwise(F.array().cast("array<string>")).alias(f"{_MEMBERS}{i}")]
    encoded = rows.select(
        F.concat(bucket_name_column(keys, key, lambda b: b.rows(generation, view.name)), window).alias(_HASH),
        F.concat(packed.bulk(key), packed.bulk(row_value_column(view))).alias(_ENTRY),
        *wide,
    )
    spec = _LoadSpec(redis_url, view.name, chunk, len(view.distinct_measures))
    counts = encoded.mapInArrow(functools.partial(_load_partition, spec), "rows long").collect()
    return sum(r.rows for r in counts)


def _sketch_prefix(bucket: Keys, *, generation: int, view: str, measure: str) -> str:
    return bucket.sketch(generation, view, measure, "")


def _load_partition(spec: _LoadSpec, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    client = redis_client(spec.redis_url)
    writer = packed.PackedWriter(client)
    written = 0
    try:
        for batch in batches:
            _queue_batch(writer, spec, batch)
            writer.flush()
            written += batch.num_rows
    finally:
        writer.close()
        client.close()
    yield pa.RecordBatch.from_pydict({"rows": [written]}, schema=pa.schema([("rows", pa.int64())]))


def _queue_batch(writer: packed.PackedWriter, spec: _LoadSpec, batch: pa.RecordBatch) -> None:
    """Queue one HSET per run of rows with the same hash (at most ``chunk`` rows), then a SET per sketch."""
    if batch.column(_ENTRY).null_count:
        raise PublishError(f"view {spec.view!r}: a gold row has no key (a null key column); nothing more was loaded")
    hashes = batch.column(_HASH).dictionary_encode()
    codes = hashes.indices.to_numpy()
    order = np.argsort(codes, kind="stable")
    codes = codes[order]
    batch = batch.take(pa.array(order))
    names = hashes.dictionary.to_pylist()
    entries = batch.column(_ENTRY)
    at, sets = _sketch_commands(spec, batch)
    bounds = sorted({0, len(codes), *(np.flatnonzero(np.diff(codes)) + 1).tolist(), *range(0, len(codes), spec.chunk)})
    for start, stop in zip(bounds, bounds[1:]):
        name = names[codes[start]]
        writer.queue(name, [packed.header(("HSET", name), 2 * (stop - start)), packed.span(entries, start, stop)], 1)
        first, last = np.searchsorted(at, [start, stop])
        writer.queue(name, sets[first:last], int(last - first))


def _sketch_commands(spec: _LoadSpec, batch: pa.RecordBatch) -> tuple[np.ndarray, list[bytes]]:
    """The SET of each wide row's sketch, and the rows they belong to (ascending)."""
    rows: list[np.ndarray] = []
    sets: list[bytes] = []
    for i in range(spec.distinct):
        sketch_keys = batch.column(f"{_SKETCH}{i}")
        wide = np.flatnonzero(sketch_keys.is_valid().to_numpy(zero_copy_only=False))
        if len(wide):
            members = batch.column(f"{_MEMBERS}{i}").take(pa.array(wide))
            rows.append(wide)
            sets += [packed.command("SET", key, sketch) for key, sketch in
                     zip(sketch_keys.take(pa.array(wide)).to_pylist(), hyperloglog.sketches(members))]
    if not rows:
        return np.zeros(0, dtype=np.int64), []
    every = np.concatenate(rows)
    order = np.argsort(every, kind="stable")
    return every[order], [sets[j] for j in order.tolist()]


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
