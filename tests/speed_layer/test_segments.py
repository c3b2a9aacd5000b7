"""Writing increments into realtime segments: every measure kind, exactly once.

The oracle is a plain-Python tally of the test's own rows; Redis is read directly.
"""

from __future__ import annotations

import json
from collections import defaultdict
from datetime import datetime, timedelta, timezone

import pytest
import redis
from pyspark.sql import functions as F

from serving.store.keys import Keys, encode_key
from serving.store.row_format import row_parts
from serving.store.session import PipelineStore
from shared_logic import Count, Distinct, Max, Min, Sum, TumblingWindow, View
from speed_layer.segments import DEPTH, WriteSpec, encode, measure_spec, write_increments

VIEW = View(
    "probe",
    keys=("a", "b"),
    measures=(Count(), Sum("x"), Min("x"), Max("x"), Distinct("m1"), Distinct("m2")),
    window=TumblingWindow(timedelta(hours=1)),
)
T0 = datetime(2026, 1, 1, 10, 0, tzinfo=timezone.utc)
ROWS = [  # a, b, x, m1, m2, minutes after T0, depth (1: only the lower base; 2: both)
    ("k|1", "z", 5.5, "p", "q", 1, 1),
    ("k", "1|z", -2.0, "p", "r", 2, 2),
    ("k|1", "z", 1.25, "s", "q", 3, 2),
    ("k|1", "z", 7.0, "p", "t", 70, 2),
]


def _write(spark, redis_url: str, batch_id: int, bases: tuple[int, ...], epoch: str) -> int:
    frame = spark.createDataFrame(
        [(a, b, x, m1, m2, T0 + timedelta(minutes=mins), depth) for a, b, x, m1, m2, mins, depth in ROWS],
        "a string, b string, x double, m1 string, m2 string, event_time timestamp, depth int",
    )
    parts = [VIEW.aggregate(frame.where(F.col("depth") == d)).withColumn(DEPTH, F.lit(d)) for d in (1, 2)]
    encoded = encode(parts[0].unionByName(parts[1]), VIEW, (4, 2))
    spec = WriteSpec(redis_url, "probe", "q1", epoch, batch_id, 100 + batch_id, bases, {"probe": measure_spec(VIEW)}, 2)
    return write_increments(encoded, spec, partitions=8).rows  # more partitions than rows: empty ones too


def _expected(depth_at_least: int) -> dict[tuple[str, int], dict]:
    tally: dict[tuple[str, int], dict] = defaultdict(lambda: {"x": [], "m1": set(), "m2": set()})
    for a, b, x, m1, m2, mins, depth in ROWS:
        if depth >= depth_at_least:
            when = T0 + timedelta(minutes=mins)
            window = int(when.timestamp()) // 3600 * 3600
            row = tally[(encode_key((a, b)), window)]
            row["x"].append(x)
            row["m1"].add(m1)
            row["m2"].add(m2)
    return tally


def _segment(client: redis.Redis, base: int) -> dict[tuple[str, int], dict]:
    """Every row of segment ``base``: its hash field's parts, each scalar checked against its ranking's score."""
    keys, found = Keys("probe"), {}
    scalars, distinct = ("count", "sum_x", "min_x", "max_x"), ("distinct_m1", "distinct_m2")
    for key, window in _expected(1):
        row = client.hget(keys.segment_rows(base, "probe", window), key)
        if row is None:
            continue
        parts = dict(zip(row_parts(VIEW), json.loads(row)))
        score = {m: float(parts[m]) for m in scalars}
        assert score == {m: client.zscore(keys.segment_scores(base, "probe", m, window), key) for m in scalars}
        for m in distinct:  # an exact list, or null: a HyperLogLog
            sketch = keys.segment_sketch(base, "probe", m, f"{key}@{window}")
            score[m] = len(parts[m]) if parts[m] is not None else client.pfcount(sketch)
        found[(key, window)] = score
    return found


def _as_scores(tally: dict) -> dict:
    return {
        k: {"count": float(len(v["x"])), "sum_x": sum(v["x"]), "min_x": min(v["x"]), "max_x": max(v["x"]),
            "distinct_m1": len(v["m1"]), "distinct_m2": len(v["m2"])}
        for k, v in tally.items()
    }


@pytest.mark.slow  # over 10 s: the end-to-end tier
def test_increments_reach_every_segment_below_their_version_exactly_once(spark, redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    epoch = PipelineStore(client, Keys("probe")).ensure_epoch()
    client.set(Keys("probe").current, 10)

    per_interval = {(d, encode_key((a, b)), mins // 60) for a, b, _, _, _, mins, d in ROWS}
    assert _write(spark, redis_url, 0, (10, 20), epoch) == len(per_interval)
    assert _segment(client, 10) == _as_scores(_expected(1))  # depth 1 and 2 rows
    assert _segment(client, 20) == _as_scores(_expected(2))  # depth 2 rows only

    before = {base: _segment(client, base) for base in (10, 20)}
    _write(spark, redis_url, 0, (10, 20), epoch)  # a replay of micro-batch 0: the guard skips it
    assert {base: _segment(client, base) for base in (10, 20)} == before

    client.set(Keys("probe").current, 20)  # generation 20 flipped in: segment 10 is dead
    _write(spark, redis_url, 1, (10, 20), epoch)
    assert _segment(client, 10) == before[10], "a dead segment was written"
    doubled = {k: {**v, "count": 2 * v["count"], "sum_x": 2 * v["sum_x"]} for k, v in before[20].items()}
    assert _segment(client, 20) == doubled
