"""Distinct counts across the two ways a batch row keeps its values, merged with realtime sketches.

A batch row with at most ``EXACT_DISTINCT_MAX`` distinct values keeps them exactly (a hash
field); a larger one keeps a HyperLogLog. Users are built on both sides of the threshold (5, 64,
65 and 150 merchants in one hour). Oracle: the exact number of distinct merchants, computed here
from the events themselves (``tests.oracle``).

* After a batch run alone, rows kept exactly answer exactly, also over a ``from``/``to`` range
  that unites two windows; larger rows are within HyperLogLog's error.
* With the speed layer adding new and repeated merchants on top (exact lists then meet realtime
  HyperLogLogs), every answer, per window and over the range, is within HyperLogLog's error.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import httpx
import pytest
import redis

from batch_layer.master.dataset import MasterDataset
from batch_layer.master.engines import get_engine
from batch_layer.recompute.job import run_batch
from serving.store.keys import Keys
from serving.store.row_format import EXACT_DISTINCT_MAX
from shared_logic import load_pipeline
from tests import oracle
from tests.support import web
from tests.support.speed import assert_exact, running_speed_layer, wait_caught_up

pytestmark = pytest.mark.slow

HOUR = datetime(2026, 5, 4, 10, 0, tzinfo=timezone.utc)
#: user -> distinct merchants in the first hour (two sides of the threshold, and its edge)
WIDTHS = {"narrow": 5, "edge": EXACT_DISTINCT_MAX, "over": EXACT_DISTINCT_MAX + 1, "wide": 150}


def _events(user: str, merchants: range, hour: datetime, prefix: str = "m") -> list[dict[str, Any]]:
    return [{"user_id": user, "merchant": f"{prefix}{m}", "amount": 1.0,
             "event_time": (hour + timedelta(seconds=10 + m)).isoformat()} for m in merchants]


def _distinct(http: httpx.Client, user: str, **params: Any) -> int:
    response = http.get(f"/v1/views/spend_by_user_hourly/keys/{user}", params=params)
    assert response.status_code == 200, response.text
    return response.json()["value"]["distinct_merchant"]


def _within_hll(got: int, want: int) -> bool:
    return abs(got - want) <= max(1, 0.03 * want)


def test_exact_and_sketched_rows_merge_with_realtime(spark, make_settings, api) -> None:
    settings = make_settings(pipeline="payments", speed_trigger_seconds=0.2)
    master = MasterDataset(settings.master_path, load_pipeline("payments"), get_engine("delta-rs"))
    first = [e for user, width in WIDTHS.items() for e in _events(user, range(width), HOUR)]
    # narrow also buys in the next hour, from 3 merchants of which 2 are new: the range unites the two
    first += _events("narrow", range(3, 6), HOUR + timedelta(hours=1))
    master.append(master.pipeline.schema.validate(first))
    generation = run_batch(spark, settings, master.pipeline, redis_url=settings.redis_url).generation

    keys, client = Keys("payments"), redis.Redis.from_url(settings.redis_url)
    hour = int(HOUR.timestamp())
    sketched = client.keys(keys.sketch(generation, "spend_by_user_hourly", "distinct_merchant", "*"))
    assert sorted(k.decode().rsplit(":", 1)[-1] for k in sketched) == [f"over@{hour}", f"wide@{hour}"], \
        "only rows above the threshold are kept as HyperLogLogs"

    def expected(version: int) -> dict[tuple[str, int | None], int]:
        rows = oracle.views("payments", oracle.read_events(settings.master_path, version))["spend_by_user_hourly"]
        return {key: m["distinct_merchant"] for key, m in rows.items()}

    window = {"from": HOUR.isoformat(), "to": (HOUR + timedelta(hours=2)).isoformat()}
    with api(pipeline="payments") as server, web.client(base_url=server.base_url, timeout=30) as http:
        want = expected(generation)
        for user in WIDTHS:
            got = _distinct(http, user, window_start=hour)
            if WIDTHS[user] <= EXACT_DISTINCT_MAX:
                assert got == want[(user, hour)], (user, got, want[(user, hour)])
            else:
                assert _within_hll(got, want[(user, hour)]), (user, got, want[(user, hour)])
        assert _distinct(http, "narrow", **window) == 6, "the range's union of two exact rows is exact"

        with running_speed_layer(spark, settings):
            more = (_events("narrow", range(3, 9), HOUR) + _events("edge", range(60, 70), HOUR)
                    + _events("wide", range(140, 170), HOUR) + _events("narrow", range(0, 4), HOUR, prefix="n")
                    + _events("newcomer", range(3), HOUR))
            master.append(master.pipeline.schema.validate(more))
            version = wait_caught_up(settings)

        want = expected(version)
        for user in (*WIDTHS, "newcomer"):
            got = _distinct(http, user, window_start=hour)
            assert _within_hll(got, want[(user, hour)]), (user, got, want[(user, hour)])
        # narrow: m0..m8 and n0..n3 in the first hour, m3..m5 in the second
        assert _within_hll(_distinct(http, "narrow", **window), 13)
        assert assert_exact(server.base_url, settings, version) >= 2 * len(WIDTHS)
