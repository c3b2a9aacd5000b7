"""A top-N merges the batch ranking and the realtime segment exactly, whichever way it reads them.

A generation of 600 keys is published into a real Redis (and a real 3-master cluster), with a
realtime segment over part of its keys and over new ones, and a micro-batch in flight that moved
some keys' realtime scores (their committed scores are saved in its undo log, as the speed layer
writes them). Values are drawn so that ties, negative sums and keys with only one part are common.
Every answer of ``queries.top_answer`` (the threshold merge for count, sum, min and max, and the
read-everything merge of a measure of unknown shape) is checked against a plain-Python oracle over
the committed parts.
"""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

import pytest

from serving.api.queries import top_answer
from serving.store import reads
from serving.store.connection import redis_client, store_keys
from serving.store.generation_meta import GenerationMeta
from serving.store.reader import ServingStore
from serving.store.session import PipelineStore
from shared_logic import Count, Max, Min, Sum, View

VIEW = View("probe", keys=("k",), measures=(Count(), Sum("x"), Min("x"), Max("x")))
MEASURES = ["count", "sum_x", "min_x", "max_x"]
GENERATION, PROCESSED = 5, 9


def _parts(rng: random.Random) -> dict[str, float]:
    xs = [rng.choice([-3.0, -0.5, 0.0, 1.0, 2.5, 4.0, 7.0]) for _ in range(rng.randint(1, 4))]
    return {"count": float(len(xs)), "sum_x": sum(xs), "min_x": min(xs), "max_x": max(xs)}


def _combine(measure: str, a: float | None, b: float | None) -> float:
    if a is None or b is None:
        return a if b is None else b  # type: ignore[return-value]
    return {"count": a + b, "sum_x": a + b, "min_x": min(a, b), "max_x": max(a, b)}[measure]


def _data(seed: int) -> tuple[dict, dict, dict]:
    """(batch parts, committed realtime parts, in-flight realtime parts) per key."""
    rng = random.Random(seed)
    batch = {f"k{i:03d}": _parts(rng) for i in range(600)}
    realtime = {k: _parts(rng) for k in rng.sample(sorted(batch), 150)}
    realtime |= {f"new{i:02d}": _parts(rng) for i in range(40)}  # keys the batch has not seen
    flight = {k: _parts(rng) for k in rng.sample(sorted(batch), 15) + rng.sample(sorted(realtime), 15)}
    flight |= {f"late{i}": {"count": 50.0, "sum_x": 99.0, "min_x": 99.0, "max_x": 99.0} for i in range(3)}
    return batch, realtime, flight


def _publish(url: str, batch: dict, realtime: dict, flight: dict) -> None:
    client, keys = redis_client(url), store_keys("probe", url)
    store = PipelineStore(client, keys)
    epoch = store.ensure_epoch()
    store.generations.begin(GENERATION, epoch)
    for key, parts in batch.items():
        client.hset(keys.for_key(key).rows(GENERATION, "probe"), key, json.dumps([parts[m] for m in MEASURES]))
    assert store.generations.flip(GENERATION, epoch, GenerationMeta(measures={"probe": MEASURES}))
    for bucket in keys.all_buckets():
        client.hset(bucket.segment_meta(GENERATION), "processed", PROCESSED)
    for measure in MEASURES:
        for key, parts in realtime.items():
            client.zadd(keys.for_key(key).segment_scores(GENERATION, "probe", measure), {key: parts[measure]})
    for key, parts in flight.items():  # in flight: new scores in place, the committed parts saved (layout order)
        bucket = keys.for_key(key)
        before = [str(realtime[key][m]) if key in realtime else "" for m in MEASURES]
        client.hset(bucket.segment_undo(GENERATION, "probe"), key, json.dumps(before))
        client.set(bucket.segment_undo_tag(GENERATION, "probe"), PROCESSED + 1)
        for measure in MEASURES:
            client.zadd(bucket.segment_scores(GENERATION, "probe", measure), {key: parts[measure]})


def _oracle(batch: dict, realtime: dict, measure: str, n: int) -> list[tuple[str, float]]:
    merged = {k: _combine(measure, batch.get(k, {}).get(measure), realtime.get(k, {}).get(measure))
              for k in batch.keys() | realtime.keys()}
    return sorted(merged.items(), key=lambda kv: (-kv[1], kv[0]))[:n]


@pytest.mark.slow  # over 4 s: the full tier (the quick tier has a 3-minute budget)
@pytest.mark.parametrize("store", ["one Redis", "cluster"])
def test_top_n_equals_the_oracle_for_every_measure_and_merge(store: str, request: pytest.FixtureRequest,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    url = request.getfixturevalue("redis_url" if store == "one Redis" else "cluster_url")
    monkeypatch.setattr(reads, "SMALL_SEGMENT", 0)  # every segment here is small: merge by the threshold
    batch, realtime, flight = _data(seed=11)
    _publish(url, batch, realtime, flight)

    async def answers(shapes: dict[str, str]) -> dict[tuple[str, int], list[tuple[str, Any]]]:
        reader = ServingStore(url, "probe")
        out = {}
        try:
            for measure in MEASURES:
                monkeypatch.setattr(type(VIEW.measure(measure)), "combines", shapes[measure])
                for n in (1, 3, 10, 40, 700):  # (700: more than every key)
                    answer = await top_answer(reader, VIEW, measure, n, None)
                    assert answer.version == PROCESSED
                    out[(measure, n)] = [(e.key, float(e.value)) for e in answer.top]
        finally:
            await reader.close()
        return out

    threshold = asyncio.run(answers({"count": "sum", "sum_x": "sum", "min_x": "min", "max_x": "max"}))
    everything = asyncio.run(answers(dict.fromkeys(MEASURES, "")))
    for (measure, n), got in threshold.items():
        want = _oracle(batch, realtime, measure, n)
        assert got == want, f"{measure} top {n} (threshold merge)"
        assert everything[(measure, n)] == want, f"{measure} top {n} (every realtime row)"
