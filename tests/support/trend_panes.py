"""A sliding view's panes written in the layers' layout, for tests of reads over several panes.

Raw events (key, event time, x, master version) drawn so that ties, negative sums, keys in one pane only
and keys only in the realtime part are common; ``publish`` writes a batch generation through the barrier's
version, the committed realtime segment after it and a micro-batch in flight (its committed parts in the
undo log), as the layers do.
"""

from __future__ import annotations

import json
import random
from datetime import timedelta

import pandas as pd

from serving.store.connection import redis_client, store_keys
from serving.store.generation_meta import GenerationMeta
from serving.store.session import PipelineStore
from shared_logic import Count, Max, Min, SlidingWindow, Sum, View

PANE, PANES = 300, 12
VIEW = View("trend", keys=("k",), measures=(Count(), Sum("x"), Min("x"), Max("x")),
            window=SlidingWindow(timedelta(seconds=PANE * 4), timedelta(seconds=PANE)))
MEASURES = ["count", "sum_x", "min_x", "max_x"]
T0 = 1_700_000_100 // PANE * PANE
BARRIER, PROCESSED = 50, 80  # versions: batch through 50, committed realtime through 80, in flight 81..90


def events_of(seed: int) -> pd.DataFrame:
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


def parts_of(events: pd.DataFrame) -> dict[tuple[str, int], list[float]]:
    """(key, pane) -> [count, sum, min, max] of ``events``: what a layer computes for its share."""
    g = events.groupby(["k", "pane"])["x"].agg(["count", "sum", "min", "max"])
    return {key: [float(v) for v in row] for key, row in zip(g.index, g.itertuples(index=False))}


def publish(url: str, events: pd.DataFrame) -> None:
    """The batch generation (events through the barrier), the realtime segment (committed events after it, then
    a micro-batch in flight over them, its committed parts in the undo log), in the layers' layout."""
    client, keys = redis_client(url), store_keys("probe", url)
    store = PipelineStore(client, keys)
    epoch = store.ensure_epoch()
    store.generations.begin(BARRIER, epoch)
    for (key, pane), parts in parts_of(events[events.version <= BARRIER]).items():
        client.hset(keys.for_key(key).rows(BARRIER, "trend", pane), key, json.dumps(parts))
    assert store.generations.flip(BARRIER, epoch, GenerationMeta(measures={"trend": MEASURES}))
    for bucket in keys.all_buckets():
        client.hset(bucket.segment_meta(BARRIER), "processed", PROCESSED)
    committed = parts_of(events[(events.version > BARRIER) & (events.version <= PROCESSED)])
    flight = parts_of(events[events.version > BARRIER])  # after the micro-batch in flight: its new scores
    for (key, pane), parts in flight.items():
        bucket = keys.for_key(key)
        for measure, score in zip(MEASURES, parts):
            client.zadd(bucket.segment_scores(BARRIER, "trend", measure, pane), {key: score})
        if parts != committed.get((key, pane)):  # the micro-batch changed it: its committed parts saved
            before = [str(v) for v in committed[(key, pane)]] if (key, pane) in committed else ["", "", "", ""]
            client.hset(bucket.segment_undo(BARRIER, "trend", pane), key, json.dumps(before))
            client.set(bucket.segment_undo_tag(BARRIER, "trend", pane), PROCESSED + 10)
