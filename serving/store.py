"""Reads from the serving store (Redis), each one atomic.

A read takes the generation pointer, the batch values and the HyperLogLog counts in one Lua
call, so it can never mix two generations even while a batch run flips the pointer.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from serving.errors import UnavailableError
from serving.keys import Keys

# KEYS[1] current pointer. ARGV: generation-prefix base, view, n fields, fields..., n distinct, measures...
_READ = """
local generation = redis.call('GET', KEYS[1])
if not generation then return false end
local base = ARGV[1] .. generation .. ':' .. ARGV[2]
local n = tonumber(ARGV[3])
local fields = {}
for i = 1, n do fields[i] = ARGV[3 + i] end
local values = redis.call('HMGET', base .. ':v', unpack(fields))
local nd = tonumber(ARGV[4 + n])
local union, each = {}, {}
for j = 1, nd do
  local prefix = base .. ':d:' .. ARGV[4 + n + j] .. ':'
  local sketches, counts = {}, {}
  for i = 1, n do
    sketches[i] = prefix .. fields[i]
    if n > 1 then counts[i] = redis.call('PFCOUNT', sketches[i]) end
  end
  union[j] = redis.call('PFCOUNT', unpack(sketches))
  each[j] = counts
end
local meta = redis.call('HMGET', ARGV[1] .. generation .. ':meta', 'computed_at', 'run_id', 'events')
return {generation, values, union, each, meta}
"""


@dataclass(frozen=True)
class Generation:
    """The served batch generation: its master version and when it was computed."""

    generation: int
    computed_at: float | None
    run_id: str | None
    events: int | None
    rows: dict[str, int] | None = None


@dataclass(frozen=True)
class KeyRead:
    """Raw parts of one read: per field the scalar parts (None: no row), and distinct counts."""

    generation: Generation
    values: list[dict[str, Any] | None]
    distinct_union: dict[str, int]
    distinct_each: dict[str, list[int]]


def _meta(generation: bytes, meta: Sequence[bytes | None]) -> Generation:
    computed_at, run_id, events = meta
    return Generation(
        int(generation),
        float(computed_at) if computed_at else None,
        run_id.decode() if run_id else None,
        int(events) if events else None,
    )


class ServingStore:
    """Async reads of one pipeline's views from Redis."""

    def __init__(self, url: str, pipeline: str) -> None:
        self.keys = Keys(pipeline)
        self._url = url
        self._client = aioredis.Redis.from_url(
            url,
            retry=Retry(ExponentialBackoff(cap=0.2, base=0.02), retries=2),
            retry_on_error=[RedisConnectionError, RedisTimeoutError],
            socket_connect_timeout=1.0,
            socket_timeout=2.0,
            max_connections=64,
        )
        self._read = self._client.register_script(_READ)

    async def close(self) -> None:
        await self._client.aclose()

    def _unavailable(self, e: Exception) -> UnavailableError:
        where = self._url.split("@")[-1]  # never echo a password
        return UnavailableError(f"Redis is unreachable at {where}: {e}")

    async def ping(self) -> None:
        try:
            await self._client.ping()
        except (RedisError, OSError) as e:
            raise self._unavailable(e) from e

    async def generation(self) -> Generation | None:
        """The served generation, or None when nothing is published."""
        try:
            generation = await self._client.get(self.keys.current)
            if generation is None:
                return None
            meta = {k.decode(): v for k, v in (await self._client.hgetall(self.keys.meta(int(generation)))).items()}
        except (RedisError, OSError) as e:
            raise self._unavailable(e) from e
        served = _meta(generation, [meta.get("computed_at"), meta.get("run_id"), meta.get("events")])
        rows = {k.removeprefix("rows:"): int(v) for k, v in meta.items() if k.startswith("rows:")}
        return Generation(served.generation, served.computed_at, served.run_id, served.events, rows)

    async def read(self, view: str, fields: Sequence[str], distinct: Sequence[str]) -> KeyRead:
        """Atomically read ``fields`` of ``view`` from the served generation."""
        args = [f"{self.keys.prefix}:g:", view, len(fields), *fields, len(distinct), *distinct]
        try:
            reply = await self._read(keys=[self.keys.current], args=args)
        except (RedisError, OSError) as e:
            raise self._unavailable(e) from e
        if reply is None:
            raise UnavailableError(
                f"no batch generation of pipeline {self.keys.pipeline!r} is published in Redis "
                "(no batch run yet, or Redis lost its data): run `lambda-platform batch run`"
            )
        generation, values, union, each, meta = reply
        return KeyRead(
            _meta(generation, meta),
            [None if v is None else json.loads(v) for v in values],
            dict(zip(distinct, (int(c) for c in union))),
            {m: [int(c) for c in counts] for m, counts in zip(distinct, each)},
        )
