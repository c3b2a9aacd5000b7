"""Integers stay integers in answers: a Sum over an int column answered ``2000.0``.

Counts are integral always; a sum, minimum or maximum is integral when its column's Spark type is
(the batch run records which in the generation's metadata, ``integral:{view}``). Realtime parts
arrive as floats; merged values of integral measures are ints again (exact below 2**53).

Oracles are plain Python over the events sent: ``tests.oracle`` for payments, and sums / minima /
maxima per shop (and hour) here for ``tests.support.int_pipeline``. Every value is compared by
value *and* JSON type (``type(got) is type(want)``), in key answers (all time, one window, a
range and its windows), ``explain`` parts and top-N entries; after a batch run alone and, in the
slow tier, with the speed layer adding events on top of it.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import httpx
import pytest

from batch_layer.master.dataset import MasterDataset
from batch_layer.recompute.job import run_batch
from deploy.settings import Settings
from shared_logic.registry import load_pipeline
from tests import oracle
from tests.support import ingest_file, key_url, web

PIPELINE = "tests.support.int_pipeline"
START = datetime(2024, 3, 1, 9, 0, tzinfo=timezone.utc)
SHOPS = ("north", "south", "east")


def orders(rng: random.Random, n: int, hours: int = 3) -> list[dict[str, Any]]:
    return [{"shop": rng.choice(SHOPS), "items": rng.randint(1, 500), "cents": rng.randint(1, 10**9),
             "event_time": (START + timedelta(seconds=rng.randrange(hours * 3600))).isoformat()} for _ in range(n)]


def expected(events: list[dict[str, Any]], hourly: bool) -> dict[tuple[str, int | None], dict[str, Any]]:
    """The oracle: measures per shop (and hour start), typed as the answers must be."""
    rows: dict[tuple[str, int | None], dict[str, Any]] = {}
    for e in events:
        t = int(datetime.fromisoformat(e["event_time"]).timestamp())
        row = rows.setdefault((e["shop"], t // 3600 * 3600 if hourly else None),
                              {"count": 0, "sum_items": 0, "min_items": None, "max_cents": None, "sum_euros": 0.0})
        row["count"] += 1
        row["sum_items"] += e["items"]
        row["min_items"] = e["items"] if row["min_items"] is None else min(row["min_items"], e["items"])
        row["max_cents"] = e["cents"] if row["max_cents"] is None else max(row["max_cents"], e["cents"])
        row["sum_euros"] += e["cents"] / 100
    for row in rows.values():
        row["avg_items"] = row["sum_items"] / row["count"]
    return rows


def differences(where: str, got: dict[str, Any], want: dict[str, Any]) -> list[str]:
    problems = []
    for name, value in want.items():
        if name not in got:
            problems.append(f"{where}: {name} missing")
        elif isinstance(value, float):
            if not (type(got[name]) is float and abs(got[name] - value) <= 1e-9 * max(1.0, abs(value))):
                problems.append(f"{where}: {name} = {got[name]!r}, oracle {value!r} (a float)")
        elif not (type(got[name]) is int and got[name] == value):
            problems.append(f"{where}: {name} = {got[name]!r}, oracle {value!r} (an int)")
    return problems


def check_orders(client: httpx.Client, events: list[dict[str, Any]]) -> None:
    problems: list[str] = []
    for (shop, _), want in expected(events, hourly=False).items():
        body = client.get(key_url("orders_by_shop", shop), params={"explain": "true"}).json()
        problems += differences(f"{shop} all time", body["value"], want)
        for side in ("batch", "realtime"):
            problems += [p for name, v in body["explain"][side].items() if v is not None and name != "sum_euros"
                         for p in ([] if type(v) is int else [f"{shop} explain {side} {name} = {v!r}"])]
    hourly = expected(events, hourly=True)
    for (shop, hour), want in hourly.items():
        body = client.get(key_url("orders_by_shop_hourly", shop), params={"window_start": str(hour)}).json()
        problems += differences(f"{shop} hour {hour}", body["value"], want)
    for shop in SHOPS:
        hours = sorted(h for s, h in hourly if s == shop)
        body = client.get(key_url("orders_by_shop_hourly", shop),
                          params={"from": str(hours[0]), "to": str(hours[-1] + 3600)}).json()
        combined = expected([e for e in events if e["shop"] == shop], hourly=False)[(shop, None)]
        problems += differences(f"{shop} range", body["value"], combined)
        for w in body["windows"]:
            hour = int(datetime.fromisoformat(w["start"]).timestamp())
            problems += differences(f"{shop} range window {hour}", w["value"], hourly[(shop, hour)])
    for measure in ("count", "sum_items", "min_items", "max_cents"):
        top = client.get("/v1/views/orders_by_shop/top", params={"measure": measure, "n": 3}).json()["top"]
        want = sorted(((s, m[measure]) for (s, _), m in expected(events, False).items()), key=lambda kv: (-kv[1], kv[0]))
        if [(e["key"], e["value"]) for e in top] != want or not all(type(e["value"]) is int for e in top):
            problems.append(f"top by {measure}: {top}, oracle {want}")
    top = client.get("/v1/views/orders_by_shop/top", params={"measure": "sum_euros"}).json()["top"]
    if not all(type(e["value"]) is float for e in top):
        problems.append(f"top by sum_euros (a float sum): {top}")
    assert not problems, f"{len(problems)} answer(s) differ from the oracle:\n" + "\n".join(problems[:30])


def publish(spark: Any, settings: Settings, events: list[dict[str, Any]], file: Path) -> int:
    ingest_file(settings, events, file)
    return run_batch(spark, settings, load_pipeline(settings.pipeline), redis_url=settings.redis_url).generation


@pytest.mark.slow  # over 4 s: the full tier (the quick tier has a 3-minute budget)
def test_integral_measures_answer_ints_after_a_batch_run(spark: Any, make_settings: Callable[..., Settings],
                                                         api: Callable[..., Any], tmp_path: Path) -> None:
    settings = make_settings(pipeline=PIPELINE)
    events = orders(random.Random(7), 300)
    publish(spark, settings, events, tmp_path / "orders.jsonl")
    with api(pipeline=PIPELINE) as server, web.client(base_url=server.base_url, timeout=30) as client:
        check_orders(client, events)


@pytest.mark.slow  # over 2.5 s in a full run: the full tier (the quick tier has a 3-minute budget)
def test_payments_counts_are_ints_and_amount_sums_floats(spark: Any, make_settings: Callable[..., Settings],
                                                         api: Callable[..., Any], tmp_path: Path) -> None:
    settings = make_settings(pipeline="payments")
    events = oracle.payments_events(random.Random(11), 120, START, seconds=4 * 3600)
    publish(spark, settings, events, tmp_path / "payments.jsonl")
    views = oracle.views("payments", oracle.read_events(settings.master_path))
    with api(pipeline="payments") as server, web.client(base_url=server.base_url, timeout=30) as client:
        for (user, _), want in views["spend_by_user"].items():
            value = client.get(key_url("spend_by_user", user)).json()["value"]
            assert type(value["count"]) is int and value["count"] == want["count"], (user, value)
            assert type(value["sum_amount"]) is float, (user, value)
        top = client.get("/v1/views/spend_by_user/top", params={"n": 5}).json()["top"]
        assert top and all(type(e["value"]) is int for e in top), top


@pytest.mark.slow
def test_integral_measures_stay_ints_merged_with_realtime_parts(spark: Any, make_settings: Callable[..., Settings],
                                                                api: Callable[..., Any], tmp_path: Path) -> None:
    from tests.support.speed import running_speed_layer, wait_caught_up

    settings = make_settings(pipeline=PIPELINE, speed_trigger_seconds=0.2)
    rng = random.Random(8)
    events = orders(rng, 200)
    publish(spark, settings, events, tmp_path / "orders.jsonl")
    master = MasterDataset.open(settings, load_pipeline(PIPELINE))
    with api(pipeline=PIPELINE) as server, web.client(base_url=server.base_url, timeout=30) as client:
        with running_speed_layer(spark, settings):
            more = orders(rng, 150)
            master.append(master.pipeline.schema.validate(more))
            wait_caught_up(settings)
        body = client.get(key_url("orders_by_shop", SHOPS[0]), params={"explain": "true"}).json()
        assert body["explain"]["realtime"]["count"], "the speed layer added a realtime part"
        check_orders(client, events + more)
