"""Where a speed-layer query starts: a checkpoint of an older segment layout rebuilds the segments; a query
stopped before its first micro-batch resumes after the generation it started after.

Real Redis and a real checkpoint folder; no stream runs (``SpeedLayer._identity`` decides where the
query starts before Spark is asked for anything).
"""

from __future__ import annotations

import json

import pytest
import redis

from batch_layer.recompute import publish
from serving.store.connection import store_keys
from serving.store.generations import ensure_epoch
from shared_logic.registry import load_pipeline
from speed_layer.job import SpeedLayer
from speed_layer.segments import SEGMENT_LAYOUT

SERVED = 7


# served_by: whose logic the served generation is of: this code's, or another's (a change of logic whose first
# batch run is not served yet): an older layout's segments go either way, since no code reads them right.
@pytest.mark.parametrize("layout, served_by, resumes", [(None, "ours", False), (None, "other", False),
                                                        (SEGMENT_LAYOUT, "ours", True)],
                         ids=["older", "older-other-logic-served", "current"])
def test_a_checkpoint_resumes_only_segments_of_the_layout_this_code_writes(
        make_settings, redis_url: str, layout: int | None, served_by: str, resumes: bool) -> None:
    settings = make_settings()
    pipeline = load_pipeline(settings.pipeline)
    client = redis.Redis.from_url(redis_url)
    keys = store_keys(pipeline.name, redis_url)
    epoch = ensure_epoch(client, keys)
    publish.begin(client, keys, SERVED, epoch)
    logic = pipeline.logic if served_by == "ours" else "0ther1ogic00"
    assert publish.flip(client, keys, SERVED, epoch, {"logic": logic})
    old_segment = keys.segment_scores(SERVED, "word_counts", "count")
    client.zadd(old_segment, {"spark": 3})  # a segment as layout 1 wrote it: no rows hash
    identity = {"query": "q-before", "epoch": epoch, "partitions": 2, "chunk": 100, "logic": pipeline.logic}
    if layout is not None:
        identity["layout"] = layout
    settings.speed_checkpoint_path.mkdir(parents=True)
    (settings.speed_checkpoint_path / "lambda_query.json").write_text(json.dumps(identity))

    job = SpeedLayer(None, settings, pipeline, redis_url=redis_url)  # type: ignore[arg-type]
    starting = job._identity()

    saved = json.loads((settings.speed_checkpoint_path / "lambda_query.json").read_text())
    if resumes:
        assert (starting, job.query_id, client.exists(old_segment)) == (-1, "q-before", 1)
    else:  # a new query after the served generation, over segments rebuilt from scratch
        assert (starting, client.exists(old_segment)) == (SERVED, 0)
        assert job.query_id != "q-before" and saved["query"] == job.query_id
    assert saved["layout"] == SEGMENT_LAYOUT


def test_a_query_stopped_before_its_first_micro_batch_resumes_after_the_generation_it_started_after(
        make_settings, redis_url: str) -> None:
    # A fresh query over an idle master writes no offsets; Spark then asks the source where to start. It must be
    # after the generation the query started after (its segments hold nothing before), not at version 0: a log
    # trimmed below that generation would stop the resumed query at every start.
    settings = make_settings()
    pipeline = load_pipeline(settings.pipeline)
    client = redis.Redis.from_url(redis_url)
    keys = store_keys(pipeline.name, redis_url)
    epoch = ensure_epoch(client, keys)
    publish.begin(client, keys, SERVED, epoch)
    assert publish.flip(client, keys, SERVED, epoch, {"logic": pipeline.logic})

    fresh = SpeedLayer(None, settings, pipeline, redis_url=redis_url)  # type: ignore[arg-type]
    assert fresh._identity() == SERVED
    resumed = SpeedLayer(None, settings, pipeline, redis_url=redis_url)  # type: ignore[arg-type]
    assert (resumed._identity(), resumed.query_id) == (SERVED, fresh.query_id)
