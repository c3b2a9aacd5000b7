"""Publishing a generation: load gold rows into Redis from the executors, then flip the pointer.

Loading writes only keys under ``lp:p:g:{V}:``, which no reader looks at until the flip; the
flip is one Lua call that moves ``lp:p:current`` to V only if V is newer than what is served.
A run that dies before the flip leaves the served generation untouched; its partial keys are
dropped by the next successful publish.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
import redis
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from batch_layer.errors import PublishError
from serving.keys import Keys, field_column
from shared_logic.views import WINDOW_START, View

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)

_FIELD, _VALUES = "_field", "_values"
_FLIP = """
local current = tonumber(redis.call('GET', KEYS[1]) or '-1')
local generation = tonumber(ARGV[1])
if generation <= current then return current end
redis.call('HSET', KEYS[2], unpack(ARGV, 2))
redis.call('SET', KEYS[1], ARGV[1])
return generation
"""


def redis_client(url: str) -> redis.Redis:
    """A client that retries connection faults with exponential backoff (Redis restarting, failing over)."""
    retry = Retry(ExponentialBackoff(cap=2.0, base=0.05), retries=6)
    return redis.Redis.from_url(
        url, retry=retry, retry_on_error=[RedisConnectionError, RedisTimeoutError], health_check_interval=30
    )


@dataclass(frozen=True)
class _LoadSpec:
    """What an executor needs to load one view's rows (picklable; no settings object, no clients)."""

    redis_url: str
    pipeline: str
    generation: int
    view: str
    distinct: tuple[str, ...]
    chunk: int


def load_view(rows: DataFrame, view: View, *, pipeline: str, generation: int, redis_url: str, chunk: int) -> int:
    """Write one view's gold rows into Redis under generation ``generation``; returns rows written.

    Encoding happens in the JVM (field names, JSON of the scalar parts); the Python workers only
    stream Arrow batches into pipelined HSET / PFADD calls, one connection per partition.
    """
    from pyspark.sql import functions as F

    scalars = [m.name for m in view.scalar_measures]
    encoded = rows.select(
        field_column(view.keys, WINDOW_START if view.window else None).alias(_FIELD),
        F.to_json(F.struct(*scalars)).alias(_VALUES),
        *(F.col(m.name) for m in view.distinct_measures),
    )
    spec = _LoadSpec(redis_url, pipeline, generation, view.name, tuple(m.name for m in view.distinct_measures), chunk)
    counts = encoded.mapInArrow(functools.partial(_load_partition, spec), "rows long").collect()
    return sum(r.rows for r in counts)


def _load_partition(spec: _LoadSpec, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    keys = Keys(spec.pipeline)
    values_key = keys.values(spec.generation, spec.view)
    client = redis_client(spec.redis_url)
    written = 0
    try:
        for batch in batches:
            columns = batch.to_pydict()
            fields, values = columns[_FIELD], columns[_VALUES]
            for start in range(0, len(fields), spec.chunk):
                stop = start + spec.chunk
                pipe = client.pipeline(transaction=False)
                pipe.hset(values_key, mapping=dict(zip(fields[start:stop], values[start:stop])))
                for measure in spec.distinct:
                    for field, members in zip(fields[start:stop], columns[measure][start:stop]):
                        if members:
                            pipe.pfadd(keys.sketch(spec.generation, spec.view, measure, field), *members)
                pipe.execute()
            written += len(fields)
    finally:
        client.close()
    yield pa.RecordBatch.from_pydict({"rows": [written]}, schema=pa.schema([("rows", pa.int64())]))


def begin(client: redis.Redis, keys: Keys, generation: int) -> None:
    """Record that ``generation`` is being loaded, so its keys are found and dropped if the run dies."""
    client.sadd(keys.generations, generation)


def flip(client: redis.Redis, keys: Keys, generation: int, meta: Mapping[str, object]) -> bool:
    """Serve ``generation`` from now on, atomically, unless a newer one is already served."""
    args: list[object] = [generation]
    for name, value in {**meta, "version": generation, "published_at": time.time()}.items():
        args += [name, value if isinstance(value, (int, float, str)) else json.dumps(value)]
    try:
        served = client.eval(_FLIP, 2, keys.current, keys.meta(generation), *args)
    except redis.RedisError as e:
        raise PublishError(f"cannot flip the served generation of {keys.pipeline!r} to {generation}: {e}") from e
    return int(served) == generation


def served_generation(client: redis.Redis, keys: Keys) -> int | None:
    value = client.get(keys.current)
    return None if value is None else int(value)


def drop_stale(client: redis.Redis, keys: Keys) -> Sequence[int]:
    """Delete every generation older than the served one (left by earlier or failed runs)."""
    served = served_generation(client, keys)
    if served is None:
        return []
    stale = sorted(g for g in (int(x) for x in client.smembers(keys.generations)) if g < served)
    for generation in stale:
        batch: list[bytes] = []
        for key in client.scan_iter(match=f"{keys.generation_prefix(generation)}:*", count=2000):
            batch.append(key)
            if len(batch) >= 2000:
                client.unlink(*batch)
                batch.clear()
        if batch:
            client.unlink(*batch)
        client.srem(keys.generations, generation)
    if stale:
        log.info("dropped stale generations %s of %s", stale, keys.pipeline)
    return stale
