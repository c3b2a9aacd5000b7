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
import random

import pandas as pd
import pytest

from serving.api.errors import BadQueryError
from serving.api.queries import top_answer
from serving.api.windows import Span
from serving.store.reader import ServingStore
from shared_logic import Average, Count, Distinct, Sum, View
from shared_logic.measures import Measure
from tests.support.trend_panes import MEASURES, PANE, PANES, PROCESSED, T0, VIEW, events_of, publish


def _oracle(events: pd.DataFrame, panes: list[int], measure: str, n: int) -> list[tuple[str, float]]:
    seen = events[(events.version <= PROCESSED) & events.pane.isin(panes)]
    how = {"count": "count", "sum_x": "sum", "min_x": "min", "max_x": "max"}[measure]
    values = seen.groupby("k")["x"].agg(how).astype(float)
    ranked = sorted(values.items(), key=lambda kv: (-kv[1], kv[0]))
    return [(k, float(v)) for k, v in ranked[:n]]


@pytest.mark.slow  # over 4 s: the full tier (the quick tier has a 3-minute budget)
@pytest.mark.parametrize("store", ["one Redis", "cluster"])
def test_top_n_over_random_ranges_equals_the_pandas_oracle(store: str, request: pytest.FixtureRequest) -> None:
    url = request.getfixturevalue("redis_url" if store == "one Redis" else "cluster_url")
    events = events_of(seed=7)
    publish(url, events)
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
