"""A minimum or maximum of zero is ``0.0``, never ``-0.0``, in both parts and merged.

IEEE's ``-0.0 == 0.0``, so ``min`` and ``max`` keep whichever zero they met first: Spark's did
for the batch part, the speed layer's fold for the realtime part, and the merge at query time
for the answer, each in its own order. So the same events answered ``-0.0`` or ``0.0`` depending
on which part held them and in what order they came. The rule now: a zero minimum or maximum is
``0.0`` in every answer (``shared_logic.measures``: ``combine``, which makes every answer's value,
reads a zero as ``0.0``). A sum of zeros answers ``0.0`` (a float), not ``0``.

The oracle is plain Python over the events sent: ``min`` / ``max`` of each user's amounts, a zero
read as ``0.0``; values are compared with their sign (``math.copysign``), in the merged answer,
both ``explain`` parts and top-N, after a batch run and with a realtime segment on top of it.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from batch_layer.recompute.job import run_batch
from deploy.settings import Settings
from serving.store.connection import redis_client, store_keys
from serving.store.session import PipelineStore
from shared_logic.measures import Max, Min, Sum
from shared_logic.registry import load_pipeline
from speed_layer.segments import DEPTH, WriteSpec, encode, measure_spec, write_increments
from tests.support import ingest_file, key_url, web

VIEW = "spend_by_user"
TIME = "2024-03-01T09:00:00+00:00"
#: user -> amounts, in the order sent: zeros of both signs first, last, alone and beside other values.
BATCH = {"alone": [-0.0], "pos_first": [0.0, -0.0], "neg_first": [-0.0, 0.0], "with_pos": [-0.0, 2.5],
         "with_neg": [-3.0, -0.0], "mixed": [0.0, -0.0, -0.0, 0.0]}
REALTIME = {"alone": [0.0], "pos_first": [-0.0], "rt_only": [-0.0], "rt_pair": [-0.0, 0.0], "with_neg": [-0.0, -1.0]}


def events(amounts: dict[str, list[float]]) -> list[dict[str, Any]]:
    return [{"user_id": user, "merchant": "m", "amount": a, "event_time": TIME} for user, xs in amounts.items() for a in xs]


def zero_is_positive(value: float) -> float:
    return 0.0 if value == 0 else value


def oracle(*parts: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    """user -> min and max of every amount sent, by plain Python, a zero read as 0.0."""
    amounts: dict[str, list[float]] = {}
    for part in parts:
        for user, xs in part.items():
            amounts.setdefault(user, []).extend(xs)
    return {u: {"min_amount": zero_is_positive(min(xs)), "max_amount": zero_is_positive(max(xs)),
                "sum_amount": zero_is_positive(float(sum(xs)))} for u, xs in amounts.items()}


def same(got: Any, want: float) -> bool:
    return isinstance(got, float) and got == want and math.copysign(1, got) == math.copysign(1, want)


def write_realtime(spark: Any, settings: Settings, base: int, sent: list[dict[str, Any]], last: int) -> None:
    """The speed layer's own write of ``sent`` into the segment based at ``base``, committed at ``last``."""
    pipeline = load_pipeline(settings.pipeline)
    store = PipelineStore(redis_client(settings.redis_url), store_keys(pipeline.name, settings.redis_url))
    frame = spark.createDataFrame(
        [(e["user_id"], e["merchant"], e["amount"], datetime.fromisoformat(e["event_time"])) for e in sent],
        "user_id string, merchant string, amount double, event_time timestamp").coalesce(1)
    rows = pipeline.transform(frame)
    parts = [encode(view.aggregate(rows).withColumn(DEPTH, F.lit(1)), view, (4, 1)) for view in pipeline.views]
    spec = WriteSpec(settings.redis_url, pipeline.name, "test-speed", store.read_epoch() or "", 0, last, (base,),
                     {view.name: measure_spec(view) for view in pipeline.views}, 500)
    write_increments(functools.reduce(DataFrame.unionByName, parts), spec, partitions=2)
    store.commit_processed([base], last)
    store.client.close()


def check(client: httpx.Client, want: dict[str, dict[str, float]], parts: dict[str, dict[str, dict[str, float]]]) -> list[str]:
    problems = []
    for user, value in want.items():
        response = client.get(key_url(VIEW, user), params={"explain": "true"})
        assert response.status_code == 200, response.text
        body = response.json()
        assert "-0.0" not in response.text, f"{user}: {response.text}"
        for name, wanted in value.items():
            if not same(body["value"][name], wanted):
                problems.append(f"{user} {name} = {body['value'][name]!r}, oracle {wanted!r}")
        for side, expected in parts.items():
            for name, wanted in expected.get(user, {}).items():
                if not same(body["explain"][side][name], wanted):
                    problems.append(f"{user} explain {side} {name} = {body['explain'][side][name]!r}, oracle {wanted!r}")
    for name in ("min_amount", "max_amount"):
        response = client.get(f"/v1/views/{VIEW}/top", params={"measure": name, "n": 100})
        assert response.status_code == 200 and "-0.0" not in response.text, response.text
        problems += [f"top {name} {e['key']} = {e['value']!r}" for e in response.json()["top"]
                     if not same(e["value"], want[e["key"]][name])]
    return problems


@pytest.mark.slow  # over 4 s: the full tier (the quick tier has a 3-minute budget)
def test_zero_minima_and_maxima_are_positive_in_both_parts_and_merged(
        spark: Any, make_settings: Callable[..., Settings], api: Callable[..., Any], tmp_path: Path) -> None:
    settings = make_settings(pipeline="payments")
    ingest_file(settings, events(BATCH), tmp_path / "batch.jsonl")
    generation = run_batch(spark, settings, load_pipeline("payments"), redis_url=settings.redis_url).generation
    with api(pipeline="payments") as server, web.client(base_url=server.base_url, timeout=30) as client:
        assert check(client, oracle(BATCH), {"batch": oracle(BATCH)}) == []
        processed = ingest_file(settings, events(REALTIME), tmp_path / "realtime.jsonl").version
        write_realtime(spark, settings, generation, events(REALTIME), processed)
        assert check(client, oracle(BATCH, REALTIME), {"batch": oracle(BATCH), "realtime": oracle(REALTIME)}) == []


def test_combine_reads_a_zero_as_positive_whatever_the_order_of_the_parts() -> None:
    """``combine`` makes every answer's value (a part alone is combined with the identity, None)."""
    for measure in (Min("amount"), Max("amount")):
        for a, b in ((-0.0, 0.0), (0.0, -0.0), (-0.0, None), (None, -0.0), (-0.0, -0.0)):
            got = measure.combine(a, b)
            assert same(got, 0.0), (measure, a, b, got)
        assert measure.combine(None, None) is None
    assert Min("amount").combine(-1.5, -0.0) == -1.5 and Max("amount").combine(2.5, -0.0) == 2.5
    assert same(Sum("amount").combine(0.0, None), 0.0) and same(Sum("amount").combine(None, -0.0), 0.0)
