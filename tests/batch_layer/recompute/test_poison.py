"""A batch run over poison events and an overflowing sum succeeds, serves the oracle's view of the other
events, and keeps each poison event once as a dead letter.

``tests.support.ratio_pipeline`` divides one field by another: a zero divisor fails Spark's ANSI
division, a tiny one makes the ratio infinite (both poison: left out, kept as letters with their
reason); two amounts of 1.5e308 for one user overflow a double (answered "overflow": in JSON, not
ranked by top-N, in the CSV export). A second run finds the same poison events and keeps no letter twice.
Engine-agnostic, so run on the default engine; that a gold write failing on a poison event commits nothing,
and is written again, is each engine's contract (tests/batch_layer/master/test_engines.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from batch_layer.master.dead_letters import DeadLetters
from batch_layer.recompute.job import run_batch
from deploy.settings import Settings
from shared_logic.registry import load_pipeline
from tests.support import ingest_file, web
from tests.support.bad_data import answer_problems, readings

PIPELINE = "tests.support.ratio_pipeline"
EVENTS = readings(("u1", 10.0, 2.0), ("u1", 6.0, 0.0), ("u2", 1e308, 1e-10), ("u2", 3.0, 1.0),
                  ("u3", 1.5e308, 1.0), ("u3", 1.5e308, 1.0), ("u4", 5.0, 4.0), ("u1", 6.0, 0.0),
                  ("u5", 1.0, 0.0))


@pytest.mark.slow  # over 10 s: the end-to-end tier
def test_poison_events_are_left_out_kept_once_and_an_overflow_is_answered_as_such(
        spark: Any, make_settings: Callable[..., Settings], api: Callable[..., Any], tmp_path: Path) -> None:
    settings = make_settings(pipeline=PIPELINE)
    ingest_file(settings, EVENTS, tmp_path / "readings.jsonl")
    pipeline = load_pipeline(PIPELINE)
    first = run_batch(spark, settings, pipeline, redis_url=settings.redis_url)
    assert first.poisoned == 4 and first.view_rows == {"ratio_by_user": 4}  # u5 had nothing but poison

    letters = DeadLetters.open(settings, pipeline.name).page(source="transform", limit=100).letters
    kept = sorted((json.loads(str(letter["raw"]))["user_id"], json.loads(str(letter["raw"]))["divisor"],
                   letter["line"], letter["field"], str(letter["reason"]).split(":")[0]) for letter in letters)
    assert kept == [("u1", 0.0, 1, None, "DIVIDE_BY_ZERO"), ("u1", 0.0, 2, None, "DIVIDE_BY_ZERO"),
                    ("u2", 1e-10, 1, "ratio", "NON_FINITE_MEASURE_INPUT"), ("u5", 0.0, 1, None, "DIVIDE_BY_ZERO")]

    with api(pipeline=PIPELINE) as server, web.client(base_url=server.base_url, timeout=30) as client:
        assert not answer_problems(client, EVENTS, version=first.generation, absent=["u5"])
        body = client.get("/v1/views/ratio_by_user/keys/u3").json()
        assert body["value"]["sum_amount"] == "overflow" and body["value"]["avg_amount"] == "overflow", body

    second = run_batch(spark, settings, pipeline, redis_url=settings.redis_url)
    assert second.poisoned == 4 and second.generation > first.generation
    assert DeadLetters.open(settings, pipeline.name).count() == 4, "a poison event was kept twice"
