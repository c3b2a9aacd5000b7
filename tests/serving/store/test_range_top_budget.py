"""A top-N over many panes whose keys all differ does bounded work per Redis call, and stays exact.

Every pane holds its own keys (the worst case of the threshold merge: each key met is scored in every other
list). The reader runs with a small work budget; around each of its ``RANGE_TOP`` calls the test reads Redis's
own counters (INFO commandstats: the ``ZSCORE``, ``ZREVRANK`` and ``ZREVRANGE`` calls Redis ran, scripts
included), never a duration. The oracle is a plain fold over the rows the test wrote. A second run starts a
micro-batch between two calls (realtime scores moved, their committed parts in the undo log): the answer is
still the committed one.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Callable
from datetime import timedelta

import pytest
import redis

from serving.api.queries import top_answer
from serving.api.windows import Span
from serving.store.connection import redis_client, store_keys
from serving.store.generation_meta import GenerationMeta
from serving.store.reader import ServingStore
from serving.store.session import PipelineStore
from shared_logic import Count, SlidingWindow, View

PANE, PANES, KEYS = 300, 48, 50
VIEW = View("trend", keys=("k",), measures=(Count(),),
            window=SlidingWindow(timedelta(seconds=PANE * 4), timedelta(seconds=PANE)))
T0 = 1_700_000_100 // PANE * PANE
BARRIER, PROCESSED = 50, 80
BUDGET = 2_000  # work per call (at least 16 a pane); 48 panes x 50 keys scored in 96 lists is ~230,000


def _publish(url: str) -> tuple[dict[tuple[str, int], float], dict[tuple[str, int], float]]:
    """Disjoint panes: pane p holds keys p:0..p:49, a batch count each and, for half of them, a realtime one."""
    rng = random.Random(11)
    client, keys = redis_client(url), store_keys("probe", url)
    store = PipelineStore(client, keys)
    epoch = store.ensure_epoch()
    store.generations.begin(BARRIER, epoch)
    batch, live = {}, {}
    for p in range(PANES):
        pane = T0 + p * PANE
        for i in range(KEYS):
            key = f"p{p:02d}:{i:02d}"
            batch[(key, pane)] = float(rng.choice([1, 1, 2, 3, 5, 8, 40, 200]) + rng.randrange(30))
            client.hset(keys.for_key(key).rows(BARRIER, "trend", pane), key, json.dumps([batch[(key, pane)]]))
            if i % 2:
                live[(key, pane)] = float(rng.randrange(1, 60))
    assert store.generations.flip(BARRIER, epoch, GenerationMeta(measures={"trend": ["count"]}))
    for bucket in keys.all_buckets():
        client.hset(bucket.segment_meta(BARRIER), "processed", PROCESSED)
    for (key, pane), score in live.items():
        client.zadd(keys.for_key(key).segment_scores(BARRIER, "trend", "count", pane), {key: score})
    return batch, live


def _fold(batch: dict, live: dict, n: int) -> list[tuple[str, float]]:
    values: dict[str, float] = {}
    for parts in (batch, live):
        for (key, _), v in parts.items():
            values[key] = values.get(key, 0.0) + v
    return sorted(values.items(), key=lambda kv: (-kv[1], kv[0]))[:n]


def _counts(client: redis.Redis) -> dict[str, int]:
    stats = client.info("commandstats")
    return {c: stats.get(f"cmdstat_{c}", {}).get("calls", 0) for c in ("zscore", "zrevrank", "zrevrange", "sismember", "evalsha")}


def _watched(reader: ServingStore, client: redis.Redis, between: Callable[[int], None]) -> list[dict[str, int]]:
    """Each ``RANGE_TOP`` call's counts of Redis commands (commandstats before and after it); ``between(i)``
    runs after call ``i``."""
    calls: list[dict[str, int]] = []
    script = reader._range_top

    async def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        before = _counts(client)
        reply = await script(*args, **kwargs)
        after = _counts(client)
        calls.append({c: after[c] - before[c] for c in after})
        between(len(calls))
        return reply

    reader._range_top = counted  # type: ignore[assignment]
    return calls


def _top(url: str, n: int, between: Callable[[int], None] = lambda i: None) -> tuple[list, list[dict[str, int]]]:
    client = redis.Redis.from_url(url)

    async def run() -> tuple[list, list[dict[str, int]]]:
        reader = ServingStore(url, "probe", top_budget=BUDGET)
        try:
            panes = [T0 + p * PANE for p in range(PANES)]
            await top_answer(reader, VIEW, "count", n, Span(panes[:1], PANE))  # not this path: one pane
            calls = _watched(reader, client, between)
            answer = await top_answer(reader, VIEW, "count", n, Span(panes, PANE))
            assert answer.version == PROCESSED
            return [(e.key, float(e.value)) for e in answer.top], calls
        finally:
            await reader.close()
            client.close()

    return asyncio.run(run())


@pytest.mark.slow  # over 4 s: the full tier (the quick tier has a 3-minute budget)
def test_every_call_stays_within_its_budget_and_the_answer_is_the_fold(redis_url: str) -> None:
    batch, live = _publish(redis_url)
    for n in (1, 25):
        got, calls = _top(redis_url, n)
        assert got == _fold(batch, live, n)
        answered = [c for c in calls if c["zscore"] or c["zrevrange"]]  # the calls that merged (not the rankings')
        assert len(answered) > 1, calls  # the work did not fit one call: it went on in further calls
        for call in answered:
            assert call["evalsha"] == 1
            assert call["zscore"] + call["zrevrank"] + call["sismember"] + call["zrevrange"] <= BUDGET, call


@pytest.mark.slow  # over 2.5 s in a full run: the full tier (the quick tier has a 3-minute budget)
def test_a_micro_batch_started_between_calls_leaves_the_answer_at_the_committed_version(redis_url: str) -> None:
    batch, live = _publish(redis_url)
    client, keys = redis_client(redis_url), store_keys("probe", redis_url)
    rng = random.Random(5)
    moved = rng.sample(sorted(live), 60)

    def start_micro_batch(call: int) -> None:  # after the second call: scores move up, committed parts saved
        if call != 2:
            return
        for key, pane in moved:
            bucket = keys.for_key(key)
            client.hset(bucket.segment_undo(BARRIER, "trend", pane), key, json.dumps([str(live[(key, pane)])]))
            client.set(bucket.segment_undo_tag(BARRIER, "trend", pane), PROCESSED + 10)
            client.zadd(bucket.segment_scores(BARRIER, "trend", "count", pane), {key: 10_000 + rng.randrange(99)})

    got, calls = _top(redis_url, 10, start_micro_batch)
    assert len(calls) > 2
    assert got == _fold(batch, live, 10)


def test_the_first_top_n_after_a_flip_asks_for_every_unranked_pane_in_one_reply(redis_url: str) -> None:
    """No pane is ranked yet: one call names them all, they are built, and the next call merges (was: a call
    per pane that only named it, panes + 1 calls before any merge)."""
    batch, live = _publish(redis_url)
    client = redis.Redis.from_url(redis_url)

    async def run() -> tuple[list, list[dict[str, int]]]:
        reader = ServingStore(redis_url, "probe")
        try:
            calls = _watched(reader, client, lambda i: None)
            answer = await top_answer(reader, VIEW, "count", 5, Span([T0 + p * PANE for p in range(PANES)], PANE))
            return [(e.key, float(e.value)) for e in answer.top], calls
        finally:
            await reader.close()
            client.close()

    got, calls = asyncio.run(run())
    assert got == _fold(batch, live, 5)
    assert [i for i, c in enumerate(calls) if not (c["zscore"] or c["zrevrange"])] == [0], calls


def test_a_top_n_of_no_keys_is_refused_before_any_call(redis_url: str) -> None:
    """n=0 would leave the merge's n-th best undefined (its stop rule reads it): refused, naming n."""
    async def run() -> None:
        reader = ServingStore(redis_url, "probe")
        try:
            with pytest.raises(ValueError, match="n=0"):
                await reader.top_range("trend", "count", [T0, T0 + PANE], 0, "sum")
        finally:
            await reader.close()

    asyncio.run(run())
