"""Loading a view's gold rows into Redis (``publish.load_view``), on one Redis and on a 3-master cluster.

Oracles: each row's parts computed here in plain Python (compared after JSON decoding, as readers
decode them), and for rows kept as a HyperLogLog, a sketch Redis builds itself by PFADD of the same
members in the same slot: the loaded sketch must count and merge exactly as Redis's own.
"""

from __future__ import annotations

import json
import random
from datetime import datetime, timezone
from typing import Any

import pytest

from batch_layer.recompute import publish
from serving.store.connection import redis_client, store_keys
from serving.store.keys import encode_field
from serving.store.row_format import EXACT_DISTINCT_MAX
from shared_logic import load_pipeline

HOURS = [datetime(2026, 11, 26, h, tzinfo=timezone.utc) for h in (3, 4)]


def _rows() -> list[tuple[Any, ...]]:
    rng = random.Random(5)
    rows = []
    for u in range(40):
        for hour in HOURS:
            width = rng.choice([0, 3, EXACT_DISTINCT_MAX, EXACT_DISTINCT_MAX + 1, 200])
            merchants = [f"m{u}-{i}-ü" for i in range(width)]
            amount = round(rng.uniform(-50, 50), 3)
            rows.append((f"user|{u}", hour, width, amount * width, amount, amount, merchants))
    return rows


@pytest.mark.parametrize("store", ["redis_url", "cluster_url"])
def test_every_row_lands_with_its_parts_and_wide_rows_with_redis_own_sketch(
        spark: Any, store: str, request: pytest.FixtureRequest) -> None:
    url = request.getfixturevalue(store)
    view = next(v for v in load_pipeline("payments").views if v.name == "spend_by_user_hourly")
    rows = _rows()
    df = spark.createDataFrame(rows, "user_id string, window_start timestamp, count long, sum_amount double, "
                                     "min_amount double, max_amount double, distinct_merchant array<string>")
    generation = random.randrange(10**6, 10**7)
    assert publish.load_view(df, view, pipeline="payments", generation=generation, redis_url=url, chunk=7) == len(rows)

    keys, client = store_keys("payments", url), redis_client(url)
    for i, (user, hour, count, total, low, high, merchants) in enumerate(rows):
        bucket, ws = keys.for_key(user), int(hour.timestamp())
        parts = json.loads(client.hget(bucket.rows(generation, view.name, ws), user))
        wide = len(merchants) > EXACT_DISTINCT_MAX
        assert parts == [float(count), total, low, high, None if wide else merchants], user
        sketch = bucket.sketch(generation, view.name, "distinct_merchant", encode_field(user, ws))
        if not wide:
            assert not client.exists(sketch)
            continue
        theirs = f"{bucket.prefix}:oracle:{generation}:{i}"  # the same slot as the row's keys
        client.pfadd(theirs, *merchants)
        assert client.pfcount(sketch) == client.pfcount(theirs)
        assert client.pfcount(sketch, theirs) == client.pfcount(theirs)
        client.delete(theirs)
    client.close()
