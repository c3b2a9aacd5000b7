"""A generation's sorted sets, built on first use by the reads that need them (``serving.store.reader``):
rankings by a scalar measure (top-N) and key indexes (key listings), from the generation's rows hash.

Why on first use: sorted sets are what costs to load (a row's four sorted-set entries took 9x the
Redis CPU of its one hash field, 679k rows), and a fine-grained windowed view has far more
(window, measure) rankings than anyone asks for. Each one built is kept while its generation is served.

Built in pages beside the final key and installed with one atomic rename (``INSTALL_RANKING``), so
Redis is never blocked for long and readers see no half-built set. Concurrent first requests of one
process share one build; of several processes, each builds one and the first installed wins. A
generation dropped meanwhile takes its pieces along.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript
from redis.exceptions import RedisError

from serving.store.errors import StoreUnavailableError
from serving.store.keys import Keys


class Rankings:
    """Builds one pipeline's rankings and key indexes for one reader; Redis failures become ``unavailable(e)``."""

    def __init__(self, client: aioredis.Redis, install: AsyncScript,
                 unavailable: Callable[[Exception], StoreUnavailableError]) -> None:
        self.client, self._install, self._unavailable = client, install, unavailable
        #: Sets this process is building, by key: concurrent first requests share one build.
        self._building: dict[str, asyncio.Future[None]] = {}

    async def by_measure(self, bucket: Keys, generation: int, view: str, measure: str, window_start: int | None,
                         position: int | None) -> None:
        """Generation ``generation``'s ranking of ``view`` by ``measure``, the part at ``position`` of each row
        (None: the generation does not hold the measure, so the ranking is empty)."""
        ranking = bucket.scores(generation, view, measure, window_start)

        def score(row: bytes) -> float | None:
            return json.loads(row)[position] if position is not None else None

        await self._build_once(bucket, ranking, generation, view, window_start, score)

    async def key_index(self, bucket: Keys, generation: int, view: str, window_start: int | None) -> None:
        """Generation ``generation``'s key index of ``view`` in one window: every key, scored 0."""
        await self._build_once(bucket, bucket.key_index(generation, view, window_start), generation, view,
                               window_start, lambda _: 0.0)

    async def _build_once(self, bucket: Keys, ranking: str, generation: int, view: str, window_start: int | None,
                          score: Callable[[bytes], float | None]) -> None:
        build = self._building.get(ranking)
        if build is None:
            build = asyncio.ensure_future(self._rank(bucket, ranking, generation, view, window_start, score))
            self._building[ranking] = build
            build.add_done_callback(lambda _: self._building.pop(ranking, None))
        await asyncio.shield(build)  # a request that gives up does not cancel the others' build

    async def _rank(self, bucket: Keys, ranking: str, generation: int, view: str, window_start: int | None,
                    score: Callable[[bytes], float | None]) -> None:
        """Build generation ``generation``'s sorted set ``ranking`` of ``view`` from its rows hash, each
        row scored by ``score`` (None: left out), and install it (see the module docstring)."""
        building = f"{ranking}:building:{uuid.uuid4().hex[:8]}"
        page: dict[bytes, float] = {}
        try:
            if await self.client.exists(ranking):  # a build that finished since this request asked
                return
            async for key, row in self.client.hscan_iter(bucket.rows(generation, view, window_start), count=2000):
                value = score(row)
                if value is not None:
                    page[key] = value
                if len(page) >= 2000:
                    await self.client.zadd(building, page)
                    page.clear()
            if page:
                await self.client.zadd(building, page)
            await self._install(keys=[building, ranking, bucket.current], args=[generation])
        except (RedisError, OSError) as e:
            raise self._unavailable(e) from e
