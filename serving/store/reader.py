"""Reads from the serving store (Redis), each one atomic.

A read takes the generation pointer, the batch parts, the realtime segment's parts and the
distinct counts in one Lua call, so it never mixes two generations, or a generation with
another generation's segment, even while a batch run flips the pointer. It reads the realtime
segment as of its ``processed`` version, leaving out a micro-batch still being written (see
``serving.store.segments``): every answer is exact at the version it names.

On a bucketed store (Redis Cluster, ``serving.store.keys``) a key's rows are all in one bucket,
so a key read is still one atomic call. A top-N asks every bucket for its candidates (one call
each, pipelined: one round trip per master) and merges them; it accepts the answers only when every bucket answered at
the same generation and realtime version, and asks again otherwise (a flip or a micro-batch
commit fell between the calls), so it never mixes generations or versions either.

Versions never go backwards: a store refuses (``StoreUnavailableError``, with the reason; the HTTP
API answers 503) rather than answer at a version lower than the highest it has answered at. That mark lives in the process: a
restarted API server starts a new one with its first answer. Across restarts the order is kept by
how versions are made: a generation published after Redis lost its data has its barrier after
the loss (``batch_layer.recompute.job`` takes the epoch before the barrier), so it is newer than
anything served before; only a rebuild from an older state would go back, and the mark catches
that within a server's life.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Mapping, Sequence

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError, RedisError

from serving.store.answer_checks import AnswerChecks
from serving.store.connection import async_redis_client, is_cluster, store_keys
from serving.store.errors import LayoutError, StoreUnavailableError
from serving.store.generation_meta import GenerationMeta, integral_field
from serving.store.heartbeat import SpeedHeartbeat
from serving.store.keys import WINDOW_SEPARATOR, Keys, suffix
from serving.store.range_top import DEFAULT_TOP_BUDGET, RANGE_TOP, bucket_range_top
from serving.store.rankings import Rankings
from serving.store.read_scripts import INSTALL_RANKING, LIST, READ, TOP
from serving.store.reads import (
    Generation,
    KeyListing,
    KeyRead,
    PaneKeys,
    RangeTopAsk,
    RangeTopRead,
    TopAsk,
    TopRead,
)
from serving.store.row_format import positions, where

__all__ = ["CLUSTER_IN_FLIGHT", "Generation", "KeyListing", "KeyRead", "PaneKeys", "RangeTopRead", "ServingStore",
           "TopRead"]

#: Store calls one API process has in flight at most on a Redis Cluster (see ``ServingStore.__init__``).
CLUSTER_IN_FLIGHT = 4

#: How often a top-N asks the buckets again for answers at one version before it refuses.
_CONSISTENT_TRIES = 50


def _num(value: bytes | str) -> float | None:
    return float(value) if value not in (b"", "") else None


class ServingStore:
    """Async, atomic reads of one pipeline's views from Redis."""

    def __init__(self, url: str, pipeline: str, definitions: Mapping[str, str] | None = None, *,
                 top_budget: int = DEFAULT_TOP_BUDGET) -> None:
        self.keys = store_keys(pipeline, url)
        self._checks = AnswerChecks(pipeline, definitions)
        self._url = url
        self._client = async_redis_client(url)
        self._read = self._client.register_script(READ)
        self._top = self._client.register_script(TOP)
        #: Scripts whose call is never sent again on a timeout (it may still be running: a retry would queue it twice).
        self._once = async_redis_client(url, retry_timeouts=False)
        self._range_top = self._once.register_script(RANGE_TOP)
        self._list = self._once.register_script(LIST)
        #: Work one ``RANGE_TOP`` call does at most (``serving.store.range_top``).
        self.top_budget = top_budget
        #: Store calls in flight at most, on a cluster: redis-py's async cluster client (8.1) under more
        #: concurrent calls fails some (MaxConnectionsError at its connection limit instead of waiting; new
        #: connections torn down mid-handshake: "Connection closed by server", "'NoneType' object has no
        #: attribute 'writelines'"); at 4 in flight, 60 rounds of 20 concurrent top-N over 16 buckets ran clean.
        self._in_flight = asyncio.Semaphore(CLUSTER_IN_FLIGHT if is_cluster(url) else 1_000_000)
        self._rankings = Rankings(self._client, self._client.register_script(INSTALL_RANKING), self._unavailable)
        #: Whether the store's recorded bucket count was seen to be this API's (``_check_layout``).
        self._layout_seen = False

    @property
    def client(self) -> aioredis.Redis:
        """The underlying async client (for metrics collectors; reads go through the methods)."""
        return self._client

    async def close(self) -> None:
        await self._client.aclose()
        await self._once.aclose()

    def _unavailable(self, e: Exception) -> StoreUnavailableError:
        where = self._url.split("@")[-1]  # never echo a password
        return StoreUnavailableError(f"Redis is unreachable at {where}: {e}")

    def _nothing_published(self) -> StoreUnavailableError:
        return StoreUnavailableError(
            f"no batch generation of pipeline {self.keys.pipeline!r} is published in Redis "
            "(no batch run yet, or Redis lost its data): run `lambda-platform batch run`"
        )

    def served(self, view: str, generation: bytes | str, processed: bytes | str, meta: Sequence) -> Generation:
        """The generation a read of ``view`` met (its pointer, ``processed`` and HEADER's ``meta``), checked
        (``serving.store.answer_checks``)."""
        return self._checks.served(view, generation, processed, meta)

    @property
    def definitions(self) -> Mapping[str, str] | None:
        """Each view's definition in the code this API runs (``AnswerChecks.definitions``)."""
        return self._checks.definitions

    @definitions.setter
    def definitions(self, definitions: Mapping[str, str] | None) -> None:
        self._checks.definitions = definitions

    async def _check_layout(self) -> None:
        """Refused when the store is laid out in another bucket count than this API's URL gives: its rows would be
        looked for in other buckets (keys not found, short top-Ns). Asked before every read until seen right."""
        if self._layout_seen:
            return
        try:
            async with self._in_flight:
                laid_out = await self._client.get(self.keys.global_keys.layout)
            LayoutError.check(self.keys.pipeline, laid_out, self.keys.buckets)
        except (RedisError, OSError) as e:
            raise self._unavailable(e) from e
        except LayoutError as e:
            raise StoreUnavailableError(f"{e} (LAMBDA_REDIS_URL of the API)") from e
        self._layout_seen = laid_out is not None

    async def ping(self) -> None:
        try:
            await self._client.ping()
        except (RedisError, OSError) as e:
            raise self._unavailable(e) from e

    async def generation(self) -> Generation | None:
        """The served generation with its metadata, or None when nothing is published."""
        await self._check_layout()
        try:
            generation = await self._client.get(self.keys.current)
            if generation is None:
                self._layout_seen = False  # as in ``call``
                return None
            reply = await self._client.hgetall(self.keys.meta(int(generation)))
            processed = await self._client.hget(self.keys.bucket(0).segment_meta(int(generation)), "processed")
        except (RedisError, OSError) as e:
            raise self._unavailable(e) from e
        return Generation.from_meta(int(generation), processed, GenerationMeta.from_hash(reply))

    async def integral_measures(self, generation: int, view: str) -> list[str] | None:
        """The measures of ``view`` whose values are integers, as generation ``generation`` recorded them (None:
        not recorded)."""
        try:
            raw = await self._client.hget(self.keys.meta(generation), integral_field(view))
        except (RedisError, OSError) as e:
            raise self._unavailable(e) from e
        return json.loads(raw) if raw else None

    async def speed_status(self) -> SpeedHeartbeat:
        """The speed layer's heartbeat (all None when it never ran)."""
        try:
            status = await self._client.hgetall(self.keys.speed)
        except (RedisError, OSError) as e:
            raise self._unavailable(e) from e
        return SpeedHeartbeat.from_hash(status)

    def register(self, script: str) -> AsyncScript:
        """A read script of this store's (``serving.store.session_reads``'s too), hashed once, for ``call``."""
        return self._client.register_script(script)

    async def call(self, script: AsyncScript, bucket: Keys, args: list) -> list:
        """``script``'s reply in ``bucket`` (StoreUnavailableError: Redis unreachable or nothing published)."""
        await self._check_layout()
        try:
            async with self._in_flight:
                reply = await script(keys=[bucket.current], args=args)
        except (RedisError, OSError) as e:
            raise self._unavailable(e) from e
        if reply is None:
            self._layout_seen = False  # a flushed store may be laid out anew by its next writer
            raise self._nothing_published()
        return reply

    async def read(
        self, view: str, items: Sequence[tuple[str, int | None]], measures: Sequence[str], distinct: Sequence[str]
    ) -> KeyRead:
        """Atomically read ``items`` (key, window start) of ``view``: batch part, realtime part, sketches.
        Every item is of one key (its windows), so in one bucket."""
        bucket = self.keys.for_key(items[0][0])
        if len(items) > 1 and any(self.keys.bucket_of(key) != bucket.bucket_index for key, _ in items):
            raise ValueError("one read covers the windows of one key; read other keys separately")
        args: list = [bucket.prefix, view, len(measures), *measures, len(distinct), *distinct, len(items)]
        for key, window_start in items:
            args += [key, suffix(window_start)]
        reply = await self.call(self._read, bucket, args)
        generation, processed, meta, layout, rows, realtime, dbatch, drealtime, dmerged, total = reply
        served = self.served(view, generation, processed, meta)
        found = where(layout, tuple(measures))

        def batch_part(row: bytes) -> dict[str, float | None]:
            if not row:
                return dict.fromkeys(measures)
            parts = json.loads(row)
            return {m: None if i is None or parts[i] is None else float(parts[i]) for m, i in zip(measures, found)}

        def counts(rows: list) -> list[dict[str, int]]:
            return [dict(zip(distinct, (int(c) for c in row))) if distinct else {} for row in rows]

        return KeyRead(
            served, [batch_part(r) for r in rows], [dict(zip(measures, (_num(v) for v in row))) for row in realtime],
            counts(dbatch), counts(drealtime), counts(dmerged), dict(zip(distinct, (int(c) for c in total))),
        )

    async def top(self, view: str, measure: str, window_start: int | None, n: int, combines: str = "") -> TopRead:
        """Candidates for the exact top ``n`` keys by ``measure``: their batch and realtime parts, from
        every bucket at one generation and version (see the module docstring). ``combines``: how the
        measure merges its parts (``Measure.combines``; 'sum', 'max', 'min' read about ``n`` keys per
        bucket, '' every realtime row)."""
        buckets = list(self.keys.all_buckets())
        ask = TopAsk(view, measure, window_start, n, combines)

        async def ask_all() -> list[list]:
            first = await self._pipelined(self._top, buckets, [ask.args(b) for b in buckets]) \
                if len(buckets) > 1 else [None]
            return await asyncio.gather(*(self._bucket_top(bucket, ask, reply) for bucket, reply in zip(buckets, first)))

        replies = await self.consistent(view, ask_all)
        return TopRead(self.served(view, *replies[0][:3]), *TopAsk.candidates(replies))

    async def top_range(self, view: str, measure: str, window_starts: Sequence[int], n: int, combines: str) -> RangeTopRead:
        """Candidates for the exact top ``n`` keys by ``measure`` over the panes ``window_starts``, with their part in
        each pane's batch ranking and realtime set, from every bucket at one generation and version (``RANGE_TOP``,
        ``serving.store.threshold``). ``combines``: 'sum', 'max' or 'min' (``Measure.combines``)."""
        ask = RangeTopAsk(view, measure, tuple(window_starts), n, combines)
        replies = await self.consistent(view, lambda: asyncio.gather(
            *(self._bucket_range_top(bucket, ask) for bucket in self.keys.all_buckets())))
        parts: dict[str, list[float | None]] = {}
        for reply in replies:
            parts.update(ask.candidates(reply[3]))
        return RangeTopRead(self.served(view, *replies[0][:3]), parts)

    async def consistent(self, view: str, ask_all: Callable[[], Awaitable[list]], tries: int = _CONSISTENT_TRIES) -> list[list]:
        """Every bucket's reply, asked again (``tries`` times at most) until they name one generation and version."""
        for _ in range(tries):
            replies = await ask_all()
            if len({(reply[0], reply[1]) for reply in replies}) == 1:
                return replies
            await asyncio.sleep(0.005)
        raise StoreUnavailableError(f"the buckets of {view!r} kept answering at different versions (flips or "
                                    "micro-batch commits in between); ask again", retry_after=1)

    async def _bucket_range_top(self, bucket: Keys, ask: RangeTopAsk) -> list:
        """One bucket's ``RANGE_TOP`` answer, in calls of bounded work (``serving.store.range_top``)."""
        async def build(generation: int, start: int, layout: bytes) -> None:
            await self._rankings.by_measure(bucket, generation, ask.view, ask.measure, start,
                                            positions(layout).get(ask.measure))

        return await bucket_range_top(lambda args: self.call(self._range_top, bucket, args), build, ask,
                                      lambda *rest: ask.args(bucket, *rest), self.top_budget)

    async def _pipelined(self, script: AsyncScript, buckets: Sequence[Keys], args: Sequence[list]) -> list[list]:
        """``script`` on every bucket, each with its ``args``, in one pipeline: one round trip per master on
        a cluster (redis-py groups the calls by node and sends the nodes' batches concurrently). Each call
        is still atomic in its bucket; the caller checks that the replies agree on the version."""
        await self._check_layout()
        for attempt in range(2):
            try:
                async with self._in_flight:
                    pipe = self._client.pipeline(transaction=False)
                    for bucket, call in zip(buckets, args):  # (redis-py blocks pipe.evalsha on a cluster for
                        pipe.execute_command("EVALSHA", script.sha, 1, bucket.current, *call)  # NOSCRIPT: handled)
                    replies = await pipe.execute(raise_on_error=False)
                if attempt == 0 and any(isinstance(r, NoScriptError) for r in replies):
                    await self._client.script_load(script.script)  # every master (a restarted one forgot it)
                    continue
            except (RedisError, OSError) as e:
                raise self._unavailable(e) from e
            break
        for reply in replies:
            if isinstance(reply, (RedisError, OSError)):
                raise self._unavailable(reply) from reply
            if reply is None:
                raise self._nothing_published()
        return replies

    async def _bucket_top(self, bucket: Keys, ask: TopAsk, reply: list | None = None) -> list:
        """One bucket's candidates: its top ``n`` batch rows (+ ties, + its realtime rows' count) and its
        realtime rows, with the generation and version they are at. ``reply``: the bucket's answer to the
        first ask, when it came with the other buckets' (``_pipelined``)."""
        ranked = ""
        for _ in range(3):  # a flip between ranking and reading asks for the new generation's ranking
            if reply is None:
                reply = await self.call(self._top, bucket, ask.args(bucket, ranked))
            if not (len(reply) == 3 and reply[1] == b"unranked"):
                return reply
            ranked = reply[0].decode()
            await self._rankings.by_measure(bucket, int(ranked), ask.view, ask.measure, ask.window_start,
                                            positions(reply[2]).get(ask.measure))
            reply = None
        raise StoreUnavailableError(
            f"the batch generation of {ask.view!r} kept changing while its ranking was built; ask again")

    async def list_keys(self, bucket: Keys, view: str, panes: Sequence[str], bounds: tuple[bytes, bytes],
                        prefix: bytes, each: int) -> KeyListing:
        """One bucket's candidates for a page of ``view``'s keys in key order, the panes ``panes`` (window
        suffixes) combined: per pane its first ``each`` batch keys in the lexicographic range ``bounds``
        (ZRANGEBYLEX) and its realtime keys with ``prefix``, with the generation and realtime version they are
        at (``LIST`` in ``serving.store.read_scripts``). Builds the generation's key index of a pane on first use."""
        lo, hi = bounds
        args = [bucket.prefix, view, prefix, lo, hi, each, len(panes), *panes]
        # Each call may meet one pane not yet indexed (built, then asked again); a flip between indexing
        # and listing asks for the new generation's index.
        for _ in range(len(panes) + 3):
            reply = await self.call(self._list, bucket, args)
            if len(reply) == 3 and reply[1] == b"unindexed":
                sfx = reply[2].decode()
                window_start = int(sfx.removeprefix(WINDOW_SEPARATOR)) if sfx else None
                generation = int(reply[0])
                await self._rankings.key_index(bucket, generation, view, window_start)
                continue
            generation, processed, meta, found = reply
            return KeyListing(self.served(view, generation, processed, meta), each,
                              [PaneKeys(batch, realtime) for batch, realtime in found])
        raise StoreUnavailableError(
            f"the batch generation of {view!r} kept changing while its key index was built; ask again", retry_after=1)
