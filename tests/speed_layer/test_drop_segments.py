"""A fresh start of the speed layer drops the realtime segments: meanwhile answers are the generation's alone.

Real Spark, Delta, Redis and HTTP. A generation is published from ingested events and a realtime
segment written and committed on top of it by the speed layer's own write code; then a speed layer
starts fresh (no checkpoint), which drops every segment, metadata first, then the data in batches.
A reader between the two (at the injected fault point) must not mix the data still there into an
answer labelled with the generation. Values are checked against pandas over the events.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from batch_layer.faults import injected
from batch_layer.recompute.job import run_batch
from deploy.settings import Settings
from shared_logic.registry import load_pipeline
from speed_layer.job import SpeedLayer
from tests.support import ingest_file, web
from tests.support.flights import AIRPORTS, ALL, PIPELINE, flights, oracle, write_realtime
from tests.support.key_pages import as_oracle, check_values, every_page, rows_of


@pytest.mark.slow  # over 10 s: the end-to-end tier
def test_answers_are_the_generations_alone_while_a_fresh_start_drops_the_segments(
        spark: Any, make_settings: Callable[..., Settings], api: Callable[..., Any], tmp_path: Path) -> None:
    settings = make_settings(pipeline=PIPELINE)
    rng = random.Random(11)
    first, realtime, last = flights(rng, 120, AIRPORTS[:4]), flights(rng, 40, AIRPORTS), flights(rng, 10, AIRPORTS[:2])
    ingest_file(settings, first, tmp_path / "e1.jsonl")
    generation = run_batch(spark, settings, load_pipeline(PIPELINE), redis_url=settings.redis_url).generation
    # Two micro-batches, the second touching a few rows: the others are in no undo log, read as they are.
    for batch_id, events in enumerate((realtime, last)):
        version = ingest_file(settings, events, tmp_path / f"e{batch_id + 2}.jsonl").version
        write_realtime(spark, settings, generation, events, version, batch_id)
    assert set(oracle(realtime)) - set(oracle(last)), "the first micro-batch should hold rows the second does not touch"

    midway: list[list[dict[str, Any]]] = []
    with api(pipeline=PIPELINE) as server, web.client(base_url=server.base_url, timeout=30) as client:
        with injected("speed-dropping-segments", lambda: midway.append(every_page(client, ALL, {}, 50))):
            starting = SpeedLayer(spark, settings, load_pipeline(PIPELINE), redis_url=settings.redis_url)._identity()
        after = every_page(client, ALL, {}, 50)

    assert starting == generation and len(midway) == 1
    for bodies in (midway[0], after):
        assert all(b["version"] == generation and b["generation"] == generation for b in bodies)
        check_values(as_oracle(rows_of(bodies)), oracle(first))
