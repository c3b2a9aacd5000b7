"""The range top-N stays exact over long skewed lists and awkward doubles, and its early stop fires.

Six panes of a few hundred keys each, scores skewed (a Zipf law: keys popular in one pane are popular in all),
with parts such as 0.1, +-1e16, 2**53, 2**53 + 2 and +inf (an overflowed sum: never ranked) mixed in, so pages
double and the merge stops deep in the lists or early. The oracle folds each key's parts in the order the
store merges them (pane by pane, batch then realtime) with Python's float addition, max and min. INFO
commandstats shows the early stop: fewer ZSCOREs than a merge that scored every key in every list.
"""

from __future__ import annotations

import asyncio
import json
import math
import random

import pytest
import redis

from serving.api.queries import top_answer
from serving.api.windows import Span
from serving.store.connection import redis_client, store_keys
from serving.store.generation_meta import GenerationMeta
from serving.store.reader import ServingStore
from serving.store.session import PipelineStore
from tests.support.trend_panes import BARRIER, MEASURES, PANE, PROCESSED, T0, VIEW

PANES = 6
AWKWARD = [0.1, 0.2, 0.3, 1e16, -1e16, 2.0 ** 53, 2.0 ** 53 + 2, -0.1, 1.0, math.inf]


def _parts(seed: int) -> dict[tuple[str, int], list[float | None]]:
    """(key, pane) -> [batch part, realtime part] of x (None: no part)."""
    rng = random.Random(seed)
    parts: dict[tuple[str, int], list[float | None]] = {}
    for p in range(PANES):
        for i in range(rng.randint(200, 400)):
            value = 1000 / (i + 1) ** 1.2 * rng.uniform(0.8, 1.2) if rng.random() < 0.8 else rng.choice(AWKWARD)
            live = rng.choice(AWKWARD) if rng.random() < 0.3 else None
            parts[(f"k{i:04d}", T0 + p * PANE)] = [value if rng.random() < 0.9 else None, live]
    return {k: v for k, v in parts.items() if v != [None, None]}


def publish(url: str, parts: dict[tuple[str, int], list[float | None]]) -> None:
    client, keys = redis_client(url), store_keys("probe", url)
    store = PipelineStore(client, keys)
    epoch = store.ensure_epoch()
    store.generations.begin(BARRIER, epoch)
    for (key, pane), (batch, _) in parts.items():
        if batch is not None:
            client.hset(keys.for_key(key).rows(BARRIER, "trend", pane), key, json.dumps([1.0, batch, batch, batch]))
    assert store.generations.flip(BARRIER, epoch, GenerationMeta(measures={"trend": MEASURES}))
    for bucket in keys.all_buckets():
        client.hset(bucket.segment_meta(BARRIER), "processed", PROCESSED)
    for (key, pane), (_, live) in parts.items():
        if live is not None:
            for measure, score in zip(MEASURES, [1.0, live, live, live]):
                client.zadd(keys.for_key(key).segment_scores(BARRIER, "trend", measure, pane), {key: score})


def _fold(parts: dict, measure: str, n: int) -> list[tuple[str, float]]:
    combine = {"sum_x": lambda a, b: a + b, "max_x": max, "min_x": min}[measure]
    values: dict[str, float] = {}
    for p in range(PANES):
        for (key, pane), pair in parts.items():
            if pane != T0 + p * PANE:
                continue
            for part in pair:
                if part is not None:
                    values[key] = part if key not in values else combine(values[key], part)
    ranked = sorted(((k, v) for k, v in values.items() if v != math.inf), key=lambda kv: (-kv[1], kv[0]))
    return ranked[:n]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_long_skewed_lists_of_awkward_doubles_rank_exactly_and_stop_early(seed: int, redis_url: str) -> None:
    parts = _parts(seed)
    publish(redis_url, parts)
    stats = redis.Redis.from_url(redis_url)
    span = Span([T0 + p * PANE for p in range(PANES)], PANE)

    async def check() -> None:
        reader = ServingStore(redis_url, "probe")
        try:
            for measure in ("sum_x", "max_x", "min_x"):
                await top_answer(reader, VIEW, measure, 1, span)  # builds the rankings: not counted
                for n in (1, 7, 40):
                    before = stats.info("commandstats").get("cmdstat_zscore", {}).get("calls", 0)
                    answer = await top_answer(reader, VIEW, measure, n, span)
                    zscores = stats.info("commandstats")["cmdstat_zscore"]["calls"] - before
                    assert [(e.key, float(e.value)) for e in answer.top] == _fold(parts, measure, n), (measure, n)
                    if measure != "min_x":  # a min's ceiling is its smallest part read: little to skip
                        assert zscores < len(parts) * 2 * PANES // 4, (measure, n, zscores)
        finally:
            await reader.close()
            stats.close()

    asyncio.run(check())
