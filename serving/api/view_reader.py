"""Reads from the serving store (Redis), each one atomic.

A read takes the generation pointer, the batch parts, the realtime segment's parts and the
distinct counts in one Lua call, so it never mixes two generations, or a generation with
another generation's segment, even while a batch run flips the pointer. It reads the realtime
segment as of its ``processed`` version, leaving out a micro-batch still being written (see
``speed_layer.segments``): every answer is exact at the version it names.

On a bucketed store (Redis Cluster, ``serving.store.keys``) a key's rows are all in one bucket,
so a key read is still one atomic call. A top-N asks every bucket for its candidates (one call
each, pipelined: one round trip per master) and merges them; it accepts the answers only when every bucket answered at
the same generation and realtime version, and asks again otherwise (a flip or a micro-batch
commit fell between the calls), so it never mixes generations or versions either.

Versions never go backwards: a store answers 503 (``UnavailableError``, with the reason) rather
than at a version lower than the highest it has answered at. That mark lives in the process: a
restarted API server starts a new one with its first answer. Across restarts the order is kept by
how versions are made: a generation published after Redis lost its data has its barrier after
the loss (``batch_layer.recompute.job`` takes the epoch before the barrier), so it is newer than
anything served before; only a rebuild from an older state would go back, and the mark catches
that within a server's life.
"""

from __future__ import annotations

import asyncio
import functools
import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError, RedisError

from serving.api.errors import UnavailableError
from serving.store.connection import async_redis_client, is_cluster, store_keys
from serving.store.heartbeat import SpeedHeartbeat
from serving.store.keys import WINDOW_SEPARATOR, Keys, suffix
from serving.store.read_scripts import INSTALL_RANKING, LIST, READ, TOP
from serving.store.replies import text

#: Store calls one API process has in flight at most on a Redis Cluster (see ``ServingStore.__init__``).
CLUSTER_IN_FLIGHT = 4

#: A bucket's realtime rows up to which a top-N reads them all rather than merging by a threshold:
#: reading about n of each list costs more calls than reading a small segment whole (about break-even
#: at 1,000 rows for top-10 in benchmarks/top_merge_bench.py).
SMALL_SEGMENT = 1_000

#: Checked reply parts remembered at most (``ServingStore._served``); one per generation and realtime version.
_CHECKED_REPLIES = 64

#: How often a top-N asks the buckets again for answers at one version before it answers 503.
_CONSISTENT_TRIES = 50


@dataclass(frozen=True)
class Generation:
    """The served batch generation (its master version) and what the speed layer added to it."""

    generation: int
    computed_at: float | None
    run_id: str | None
    events: int | None
    processed: int | None = None
    rows: dict[str, int] = field(default_factory=dict)
    #: The logic fingerprint it was computed under (``shared_logic.logic``); '' when published before it was recorded.
    logic: str = ""

    @property
    def version(self) -> int:
        """The master version answers are exact for: the generation, or what the speed layer applied after it."""
        return max(self.generation, self.processed or -1)


@dataclass(frozen=True)
class KeyRead:
    """Raw parts of one read, per item (key in a window): batch and realtime scalars and distinct counts."""

    generation: Generation
    batch: list[dict[str, float | None]]
    realtime: list[dict[str, float | None]]
    distinct_batch: list[dict[str, int]]
    distinct_realtime: list[dict[str, int]]
    distinct_merged: list[dict[str, int]]
    distinct_total: dict[str, int]


@dataclass(frozen=True)
class TopRead:
    generation: Generation
    batch: dict[str, float]
    realtime: dict[str, float]


@dataclass(frozen=True)
class WindowKeys:
    """One window's candidates in a key listing (``ServingStore.list_keys``): its index in the windows
    asked for, how many batch keys were asked (as many came back: there may be more), the batch keys
    and every realtime key with the prefix (keys are bytes: their order is Redis's, bytewise)."""

    index: int
    wanted: int
    batch: list[bytes]
    realtime: list[bytes]


@dataclass(frozen=True)
class KeyListing:
    generation: Generation
    windows: list[WindowKeys]


@dataclass(frozen=True)
class TopAsk:
    """What a top-N asks each bucket (``TOP`` in ``serving.store.read_scripts``)."""

    view: str
    measure: str
    window_start: int | None
    n: int
    combines: str

    def args(self, bucket: Keys, ranked: str = "") -> list:
        return [bucket.prefix, self.view, self.measure, suffix(self.window_start), self.n, ranked, self.combines,
                SMALL_SEGMENT]


@functools.lru_cache(maxsize=256)
def _positions(layout: bytes) -> dict[str, int]:
    """Measure name -> index in a batch row, from the generation's ``measures:{view}`` (JSON list)."""
    return {name: i for i, name in enumerate(json.loads(layout))}


@functools.lru_cache(maxsize=256)
def _where(layout: bytes, measures: tuple[str, ...]) -> list[int | None]:
    """Where each of ``measures`` is in a batch row of the layout ``layout`` (None: not in it)."""
    positions = _positions(layout)
    return [positions.get(m) for m in measures]


def _num(value: bytes | str) -> float | None:
    return float(value) if value not in (b"", "") else None


def _generation(generation: bytes | str, processed: bytes | str, meta: Sequence[bytes | str | None]) -> Generation:
    computed_at, run_id, events, logic = meta[:4]
    return Generation(
        int(generation),
        float(computed_at) if computed_at else None,
        text(run_id) if run_id else None,
        int(events) if events else None,
        int(processed) if processed else None,
        logic=text(logic) if logic else "",
    )


def _definition_changed(view: str, served: Generation) -> UnavailableError:
    return UnavailableError(
        f"view {view!r} is defined differently in the served batch generation {served.generation} (computed under "
        f"logic {served.logic or 'unrecorded'}) than in the pipeline code this API runs: it is served once a batch "
        "run under this code is (the scheduler starts one when it sees the change)", headers={"Retry-After": "30"})


def _not_in_generation(view: str, served: Generation) -> UnavailableError:
    """A view the served generation does not hold: one added to the pipeline since it was computed."""
    return UnavailableError(
        f"view {view!r} is not in the served batch generation {served.generation} (computed under logic "
        f"{served.logic or 'unrecorded'}, before the view was added): it is served once a batch run under the "
        "current pipeline code is (the scheduler starts one when it sees the change)", headers={"Retry-After": "30"})


class ServingStore:
    """Async, atomic reads of one pipeline's views from Redis."""

    def __init__(self, url: str, pipeline: str, definitions: Mapping[str, str] | None = None) -> None:
        self.keys = store_keys(pipeline, url)
        #: Each view's definition (``repr``) in the code this API runs: a generation that recorded another one for
        #: a view is not read through this code (its windows or keys would be taken for others'). None: no check.
        self.definitions = definitions
        self._url = url
        self._client = async_redis_client(url)
        self._read = self._client.register_script(READ)
        self._top = self._client.register_script(TOP)
        self._install = self._client.register_script(INSTALL_RANKING)
        self._list = self._client.register_script(LIST)
        #: The highest version this process has answered at (see the module docstring).
        self._answered = -1
        #: Store calls in flight at most, on a cluster: redis-py's async cluster client (8.1) under more
        #: concurrent calls fails some (MaxConnectionsError at its connection limit instead of waiting; new
        #: connections torn down mid-handshake: "Connection closed by server", "'NoneType' object has no
        #: attribute 'writelines'"); at 4 in flight, 60 rounds of 20 concurrent top-N over 16 buckets ran clean.
        self._in_flight = asyncio.Semaphore(CLUSTER_IN_FLIGHT if is_cluster(url) else 1_000_000)
        #: Reply parts a read met, and the generation they name, once they passed the view check (``_served``).
        self._checked: dict[tuple, Generation] = {}
        #: Rankings this process is building, by key: concurrent first requests share one build.
        self._building: dict[str, asyncio.Future[None]] = {}

    @property
    def client(self) -> aioredis.Redis:
        """The underlying async client (for metrics collectors; reads go through the methods)."""
        return self._client

    async def close(self) -> None:
        await self._client.aclose()

    def _unavailable(self, e: Exception) -> UnavailableError:
        where = self._url.split("@")[-1]  # never echo a password
        return UnavailableError(f"Redis is unreachable at {where}: {e}")

    def _nothing_published(self) -> UnavailableError:
        return UnavailableError(
            f"no batch generation of pipeline {self.keys.pipeline!r} is published in Redis "
            "(no batch run yet, or Redis lost its data): run `lambda-platform batch run`"
        )

    def _not_older(self, served: Generation) -> Generation:
        """``served``, unless it is older than a version already answered at: then 503, saying why."""
        if served.version < self._answered:
            raise UnavailableError(
                f"the serving store of pipeline {self.keys.pipeline!r} holds master version {served.version}, older "
                f"than version {self._answered} already answered at (Redis lost data, or the speed layer is "
                "rebuilding its segments): answers resume once it is as new again; retry shortly",
                headers={"Retry-After": "2"},
            )
        self._answered = served.version
        return served

    def _check_view(self, view: str, generation: bytes | str, processed: bytes | str, meta: Sequence) -> None:
        """503 unless the generation a read met holds ``view`` as this API's code defines it (meta: HEADER's)."""
        if meta[4] is None:
            raise _not_in_generation(view, _generation(generation, processed, meta))
        recorded = meta[5]
        if recorded is not None and self.definitions is not None and text(recorded) != self.definitions.get(view):
            raise _definition_changed(view, _generation(generation, processed, meta))

    def _served(self, view: str, generation: bytes | str, processed: bytes | str, meta: Sequence) -> Generation:
        """The generation a read of ``view`` met (its pointer, ``processed`` and HEADER's ``meta``), checked
        (``_check_view``, ``_not_older``). Replies that passed the view check are remembered: the same
        parts give the same generation and the same verdict (a generation's metadata never changes, and
        every part, and this API's definition of the view, is in the cache key), so a read of a known
        generation skips both."""
        seen = (view, None if self.definitions is None else self.definitions.get(view), generation, processed, *meta)
        served = self._checked.get(seen)
        if served is None:
            self._check_view(view, generation, processed, meta)
            served = _generation(generation, processed, meta)
            if len(self._checked) >= _CHECKED_REPLIES:
                self._checked.clear()
            self._checked[seen] = served
        return self._not_older(served)

    async def ping(self) -> None:
        try:
            await self._client.ping()
        except (RedisError, OSError) as e:
            raise self._unavailable(e) from e

    async def generation(self) -> Generation | None:
        """The served generation with its metadata, or None when nothing is published."""
        try:
            generation = await self._client.get(self.keys.current)
            if generation is None:
                return None
            reply = await self._client.hgetall(self.keys.meta(int(generation)))
            processed = await self._client.hget(self.keys.bucket(0).segment_meta(int(generation)), "processed")
        except (RedisError, OSError) as e:
            raise self._unavailable(e) from e
        meta = {text(k): v for k, v in reply.items()}
        served = _generation(generation, processed or b"",
                             [meta.get("computed_at"), meta.get("run_id"), meta.get("events"), meta.get("logic")])
        rows = {k.removeprefix("rows:"): int(v) for k, v in meta.items() if k.startswith("rows:")}
        return Generation(**{**served.__dict__, "rows": rows})

    async def speed_status(self) -> SpeedHeartbeat:
        """The speed layer's heartbeat (all None when it never ran)."""
        try:
            status = await self._client.hgetall(self.keys.speed)
        except (RedisError, OSError) as e:
            raise self._unavailable(e) from e
        return SpeedHeartbeat.from_hash(status)

    async def _call(self, script: AsyncScript, bucket: Keys, args: list) -> list:
        try:
            async with self._in_flight:
                reply = await script(keys=[bucket.current], args=args)
        except (RedisError, OSError) as e:
            raise self._unavailable(e) from e
        if reply is None:
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
        reply = await self._call(self._read, bucket, args)
        generation, processed, meta, layout, rows, realtime, dbatch, drealtime, dmerged, total = reply
        served = self._served(view, generation, processed, meta)
        where = _where(layout, tuple(measures))

        def batch_part(row: bytes) -> dict[str, float | None]:
            if not row:
                return dict.fromkeys(measures)
            parts = json.loads(row)
            return {m: None if i is None or parts[i] is None else float(parts[i]) for m, i in zip(measures, where)}

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
        for _ in range(_CONSISTENT_TRIES):
            first = await self._pipelined(self._top, buckets, [ask.args(b) for b in buckets]) \
                if len(buckets) > 1 else [None]
            replies = await asyncio.gather(*(self._bucket_top(bucket, ask, reply)
                                             for bucket, reply in zip(buckets, first)))
            if len({(reply[0], reply[1]) for reply in replies}) == 1:
                break
            await asyncio.sleep(0.005)
        else:
            raise UnavailableError(f"the buckets of {view!r} kept answering at different versions (flips or "
                                   "micro-batch commits in between); ask again", headers={"Retry-After": "1"})
        batch: dict[str, float] = {}
        rt: dict[str, float] = {}
        for _, _, _, top, realtime, under in replies:
            batch.update({top[i].decode(): float(top[i + 1]) for i in range(0, len(top), 2)})
            members = [realtime[i].decode() for i in range(0, len(realtime), 2)]
            batch.update({m: float(s) for m, s in zip(members, under) if s not in (b"", "")})
            rt.update({members[i // 2]: float(realtime[i + 1]) for i in range(0, len(realtime), 2)})
        return TopRead(self._served(view, *replies[0][:3]), batch, rt)

    async def _pipelined(self, script: AsyncScript, buckets: Sequence[Keys], args: Sequence[list]) -> list[list]:
        """``script`` on every bucket, each with its ``args``, in one pipeline: one round trip per master on
        a cluster (redis-py groups the calls by node and sends the nodes' batches concurrently). Each call
        is still atomic in its bucket; the caller checks that the replies agree on the version."""
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
                reply = await self._call(self._top, bucket, ask.args(bucket, ranked))
            if not (len(reply) == 3 and reply[1] == b"unranked"):
                return reply
            ranked = reply[0].decode()
            await self._rank_once(bucket, int(ranked), ask.view, ask.measure, ask.window_start,
                                  _positions(reply[2]).get(ask.measure))
            reply = None
        raise UnavailableError(f"the batch generation of {ask.view!r} kept changing while its ranking was built; ask again")

    async def _rank_once(self, bucket: Keys, generation: int, view: str, measure: str, window_start: int | None,
                         position: int | None) -> None:
        """``_rank``, shared by the requests of this process that need the same ranking at once."""
        ranking = bucket.scores(generation, view, measure, window_start)

        def score(row: bytes) -> float | None:
            return json.loads(row)[position] if position is not None else None

        await self._build_once(bucket, ranking, generation, view, window_start, score)

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
        row scored by ``score`` (None: left out): a ranking by a measure, or the key index (all 0).

        Built in pages beside the final key and installed with one atomic rename, so Redis is never
        blocked for long and readers see no half-built ranking. Concurrent first requests of one
        process share one build; of several processes, each builds one and the first installed wins.
        A generation dropped meanwhile takes its pieces along.
        """
        building = f"{ranking}:building:{uuid.uuid4().hex[:8]}"
        page: dict[bytes, float] = {}
        try:
            if await self._client.exists(ranking):  # a build that finished since this request asked
                return
            async for key, row in self._client.hscan_iter(bucket.rows(generation, view, window_start), count=2000):
                value = score(row)
                if value is not None:
                    page[key] = value
                if len(page) >= 2000:
                    await self._client.zadd(building, page)
                    page.clear()
            if page:
                await self._client.zadd(building, page)
            await self._install(keys=[building, ranking, bucket.current], args=[generation])
        except (RedisError, OSError) as e:
            raise self._unavailable(e) from e

    async def list_keys(self, bucket: Keys, view: str, windows: Sequence[str], first: int,
                        bounds: tuple[bytes, bytes, bytes], prefix: bytes, limit: int) -> KeyListing:
        """One bucket's candidates for a page of ``view``'s keys, in order (window, key), from window
        ``first`` (an index into the window suffixes ``windows``) on, with the generation and realtime
        version they are at (``LIST`` in ``serving.store.read_scripts``). ``bounds``: the lexicographic
        range (ZRANGEBYLEX) in the first window, in the others, and its upper end; ``prefix``: the
        realtime keys kept. Builds the generation's key index of a window on first use."""
        lo_first, lo_rest, hi = bounds
        args = [bucket.prefix, view, prefix, hi, limit, first + 1, lo_first, lo_rest, len(windows), *windows]
        # Each call may meet one window not yet indexed (built, then asked again); a flip between indexing
        # and listing asks for the new generation's index.
        for _ in range(len(windows) - first + 3):
            reply = await self._call(self._list, bucket, args)
            if len(reply) == 3 and reply[1] == b"unindexed":
                sfx = reply[2].decode()
                window_start = int(sfx.removeprefix(WINDOW_SEPARATOR)) if sfx else None
                generation = int(reply[0])
                await self._build_once(bucket, bucket.key_index(generation, view, window_start), generation, view,
                                       window_start, lambda _: 0.0)
                continue
            generation, processed, meta, found = reply
            return KeyListing(self._served(view, generation, processed, meta),
                              [WindowKeys(int(w) - 1, int(wanted), batch, realtime) for w, wanted, batch, realtime in found])
        raise UnavailableError(f"the batch generation of {view!r} kept changing while its key index was built; ask again",
                               headers={"Retry-After": "1"})
