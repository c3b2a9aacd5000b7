"""A top-N over several panes is exact: the threshold merge of every pane's batch ranking and realtime set.

Raw events (key, event time, x, master version) are drawn so that ties, negative sums, keys in one pane only
and keys only in the realtime part are common. A barrier splits them, as a batch run does: events up to the
barrier's version are the batch generation's panes, later ones the realtime segment's, written in the
layout the layers write (a batch row hash per pane, a realtime sorted set per pane and measure); late events
land in old panes; a micro-batch in flight moved some realtime scores (its committed parts are in the undo
log). The oracle is pandas over the raw events at the committed version: per key, the events of the panes
a range covers, summed, counted, min'd and max'd, ranked by (value desc, key). ``queries.top_answer`` over
random ranges (on one Redis and on a 3-master cluster) must equal it, for every measure and several n.
"""

from __future__ import annotations

import asyncio
import json
import random
from datetime import timedelta

import pandas as pd
import pytest

from serving.api.errors import BadQueryError
from serving.api.queries import top_answer
from serving.api.windows import Span
from serving.store.connection import redis_client, store_keys
from serving.store.generation_meta import GenerationMeta
from serving.store.reader import ServingStore
from serving.store.session import PipelineStore
from shared_logic import Average, Count, Distinct, Max, Min, SlidingWindow, Sum, View
from shared_logic.measures import Measure

PANE, PANES = 300, 12
VIEW = View("trend", keys=("k",), measures=(Count(), Sum("x"), Min("x"), Max("x")),
            window=SlidingWindow(timedelta(seconds=PANE * 4), timedelta(seconds=PANE)))
MEASURES = ["count", "sum_x", "min_x", "max_x"]
T0 = 1_700_000_100 // PANE * PANE
BARRIER, PROCESSED = 50, 80  # versions: batch through 50, committed realtime through 80, in flight 81..90


def _events(seed: int) -> pd.DataFrame:
    rng = random.Random(seed)
    keys = [f"k{i:03d}" for i in range(120)]
    rows = []
    for version in range(1, 91):
        for _ in range(rng.randint(3, 12)):
            key = rng.choice(keys[:15]) if rng.random() < 0.4 else rng.choice(keys)  # some keys popular everywhere
            pane = rng.randrange(PANES) if version <= BARRIER or rng.random() < 0.3 else rng.randrange(PANES - 3, PANES)
            rows.append({"k": key, "t": T0 + pane * PANE + rng.randrange(PANE), "version": version,
                         "x": rng.choice([-3.0, -0.5, 0.0, 1.0, 2.5, 4.0, 7.0])})
    events = pd.DataFrame(rows)
    events["pane"] = events["t"] // PANE * PANE
    return events


def _parts(events: pd.DataFrame) -> dict[tuple[str, int], list[float]]:
    """(key, pane) -> [count, sum, min, max] of ``events``: what a layer computes for its share."""
    g = events.groupby(["k", "pane"])["x"].agg(["count", "sum", "min", "max"])
    return {key: [float(v) for v in row] for key, row in zip(g.index, g.itertuples(index=False))}


def _publish(url: str, events: pd.DataFrame) -> None:
    """The batch generation (events through the barrier), the realtime segment (committed events after it, then
    a micro-batch in flight over them, its committed parts in the undo log), in the layers' layout."""
    client, keys = redis_client(url), store_keys("probe", url)
    store = PipelineStore(client, keys)
    epoch = store.ensure_epoch()
    store.generations.begin(BARRIER, epoch)
    for (key, pane), parts in _parts(events[events.version <= BARRIER]).items():
        client.hset(keys.for_key(key).rows(BARRIER, "trend", pane), key, json.dumps(parts))
    assert store.generations.flip(BARRIER, epoch, GenerationMeta(measures={"trend": MEASURES}))
    for bucket in keys.all_buckets():
        client.hset(bucket.segment_meta(BARRIER), "processed", PROCESSED)
    committed = _parts(events[(events.version > BARRIER) & (events.version <= PROCESSED)])
    flight = _parts(events[events.version > BARRIER])  # after the micro-batch in flight: its new scores
    for (key, pane), parts in flight.items():
        bucket = keys.for_key(key)
        for measure, score in zip(MEASURES, parts):
            client.zadd(bucket.segment_scores(BARRIER, "trend", measure, pane), {key: score})
        if parts != committed.get((key, pane)):  # the micro-batch changed it: its committed parts saved
            before = [str(v) for v in committed[(key, pane)]] if (key, pane) in committed else ["", "", "", ""]
            client.hset(bucket.segment_undo(BARRIER, "trend", pane), key, json.dumps(before))
            client.set(bucket.segment_undo_tag(BARRIER, "trend", pane), PROCESSED + 10)


def _oracle(events: pd.DataFrame, panes: list[int], measure: str, n: int) -> list[tuple[str, float]]:
    seen = events[(events.version <= PROCESSED) & events.pane.isin(panes)]
    how = {"count": "count", "sum_x": "sum", "min_x": "min", "max_x": "max"}[measure]
    values = seen.groupby("k")["x"].agg(how).astype(float)
    ranked = sorted(values.items(), key=lambda kv: (-kv[1], kv[0]))
    return [(k, float(v)) for k, v in ranked[:n]]


@pytest.mark.parametrize("store", ["one Redis", "cluster"])
def test_top_n_over_random_ranges_equals_the_pandas_oracle(store: str, request: pytest.FixtureRequest) -> None:
    url = request.getfixturevalue("redis_url" if store == "one Redis" else "cluster_url")
    events = _events(seed=7)
    _publish(url, events)
    rng = random.Random(3)
    ranges = [(0, PANES), (0, 4), (PANES - 4, PANES), *((a, rng.randint(a + 2, PANES)) for a in
                                                         (rng.randrange(PANES - 2) for _ in range(6)))]

    async def check() -> None:
        reader = ServingStore(url, "probe")
        try:
            for first, end in ranges:
                panes = [T0 + i * PANE for i in range(first, end)]
                for measure in MEASURES:
                    for n in (1, 5, 10, 200):
                        answer = await top_answer(reader, VIEW, measure, n, Span(panes, PANE))
                        assert answer.version == PROCESSED
                        got = [(e.key, float(e.value)) for e in answer.top]
                        assert got == _oracle(events, panes, measure, n), (first, end, measure, n)
        finally:
            await reader.close()

    asyncio.run(check())


class _Own(Measure):
    """A measure of the user's own, combining its own way: it ranks in one pane only."""

    kind = "own"

    def aggregate(self):  # type: ignore[no-untyped-def]
        raise NotImplementedError

    def combine(self, a, b):  # type: ignore[no-untyped-def]
        return a if b is None else b


def test_measures_that_cannot_rank_over_panes_are_refused_saying_why(redis_url: str) -> None:
    view = View("trend", keys=("k",), measures=(Count(), Sum("x"), Distinct("m"), _Own("y")),
                derived=(Average("x"),), window=VIEW.window)
    span = Span([T0, T0 + PANE], PANE)

    async def refused(measure: str) -> str:
        reader = ServingStore(redis_url, "probe")
        try:
            with pytest.raises(BadQueryError) as e:
                await top_answer(reader, view, measure, 10, span)
        finally:
            await reader.close()
        return str(e.value)

    assert "distinct count" in asyncio.run(refused("distinct_m"))
    assert "derived" in (avg := asyncio.run(refused("avg_x"))) and "sum_x" in avg
    assert "one pane only" in asyncio.run(refused("own_y"))
