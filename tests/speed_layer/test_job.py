"""Where a speed-layer query starts: a checkpoint of an older segment layout rebuilds the segments, one of
another format starts a fresh query; a query stopped before its first micro-batch resumes after the generation
it started after. How a micro-batch is tagged: one after a micro-batch that ended inside a version carries that
one's tag on.

Real Redis and a real checkpoint folder; no stream runs (``SpeedLayer._identity`` decides where the
query starts before Spark is asked for anything).
"""

from __future__ import annotations

import json
import logging
from typing import NamedTuple

import pytest
import redis

from deploy.settings import Settings
from serving.store.connection import store_keys
from serving.store.generation_meta import GenerationMeta
from serving.store.keys import Keys
from serving.store.segments import SEGMENT_LAYOUT
from serving.store.session import PipelineStore
from shared_logic.pipeline import Pipeline
from shared_logic.registry import load_pipeline
from speed_layer.identity import CHECKPOINT_FORMAT
from speed_layer.input import Summary, ends_inside_version
from speed_layer.job import SpeedLayer
from speed_layer.plan import Plan

SERVED = 7


class _Served(NamedTuple):
    settings: Settings
    pipeline: Pipeline
    client: redis.Redis
    keys: Keys
    epoch: str


def _served(make_settings, redis_url: str, logic: str | None = None) -> _Served:
    """Generation SERVED published and served, computed under ``logic`` (default: the pipeline's)."""
    settings = make_settings()
    pipeline = load_pipeline(settings.pipeline)
    client = redis.Redis.from_url(redis_url)
    keys = store_keys(pipeline.name, redis_url)
    store = PipelineStore(client, keys)
    epoch = store.ensure_epoch()
    store.generations.begin(SERVED, epoch)
    assert store.generations.flip(SERVED, epoch, GenerationMeta(logic=logic or pipeline.logic))
    return _Served(settings, pipeline, client, keys, epoch)


# served_by: whose logic the served generation is of: this code's, or another's (a change of logic whose first
# batch run is not served yet): an older layout's segments go either way, since no code reads them right.
@pytest.mark.parametrize("layout, served_by, resumes", [(None, "ours", False), (None, "other", False),
                                                        (SEGMENT_LAYOUT, "ours", True)],
                         ids=["older", "older-other-logic-served", "current"])
def test_a_checkpoint_resumes_only_segments_of_the_layout_this_code_writes(
        make_settings, redis_url: str, layout: int | None, served_by: str, resumes: bool) -> None:
    settings, pipeline, client, keys, epoch = _served(make_settings, redis_url,
                                                      None if served_by == "ours" else "0ther1ogic00")
    old_segment = keys.segment_scores(SERVED, "word_counts", "count")
    client.zadd(old_segment, {"spark": 3})  # a segment as layout 1 wrote it: no rows hash
    identity = {"query": "q-before", "epoch": epoch, "partitions": 2, "chunk": 100, "logic": pipeline.logic,
                "format": CHECKPOINT_FORMAT, "starting": SERVED}
    if layout is not None:
        identity["layout"] = layout
    settings.speed_checkpoint_path.mkdir(parents=True)
    (settings.speed_checkpoint_path / "lambda_query.json").write_text(json.dumps(identity))

    job = SpeedLayer(None, settings, pipeline, redis_url=redis_url)  # type: ignore[arg-type]
    starting = job._identity()

    saved = json.loads((settings.speed_checkpoint_path / "lambda_query.json").read_text())
    if resumes:
        assert (starting, job.query_id, client.exists(old_segment)) == (SERVED, "q-before", 1)
    else:  # a new query after the served generation, over segments rebuilt from scratch
        assert (starting, client.exists(old_segment)) == (SERVED, 0)
        assert job.query_id != "q-before" and saved["query"] == job.query_id
    assert saved["layout"] == SEGMENT_LAYOUT


def test_a_query_stopped_before_its_first_micro_batch_resumes_after_the_generation_it_started_after(
        make_settings, redis_url: str) -> None:
    # A fresh query over an idle master writes no offsets; Spark then asks the source where to start. It must be
    # after the generation the query started after (its segments hold nothing before), not at version 0: a log
    # trimmed below that generation would stop the resumed query at every start.
    settings, pipeline, client, keys, _ = _served(make_settings, redis_url)

    fresh = SpeedLayer(None, settings, pipeline, redis_url=redis_url)  # type: ignore[arg-type]
    assert fresh._identity() == SERVED
    resumed = SpeedLayer(None, settings, pipeline, redis_url=redis_url)  # type: ignore[arg-type]
    assert (resumed._identity(), resumed.query_id) == (SERVED, fresh.query_id)



@pytest.mark.parametrize("format_", [None, CHECKPOINT_FORMAT + 1], ids=["unrecorded", "newer"])
def test_a_checkpoint_of_another_format_starts_a_fresh_query_and_says_why(
        make_settings, redis_url: str, format_: int | None, caplog: pytest.LogCaptureFixture) -> None:
    settings, pipeline, client, keys, _ = _served(make_settings, redis_url)
    before = SpeedLayer(None, settings, pipeline, redis_url=redis_url)  # type: ignore[arg-type]
    before._identity()
    segment = keys.segment_rows(SERVED, "word_counts")
    client.hset(segment, "spark", "[\"3.0\"]")  # counted by the query before: rebuilt by the fresh one
    identity = settings.speed_checkpoint_path / "lambda_query.json"
    saved = json.loads(identity.read_text())
    if format_ is None:
        del saved["format"]
    else:
        saved["format"] = format_
    identity.write_text(json.dumps(saved))

    with caplog.at_level(logging.WARNING, logger="speed_layer.identity"):
        fresh = SpeedLayer(None, settings, pipeline, redis_url=redis_url)  # type: ignore[arg-type]
        starting = fresh._identity()
    assert (starting, client.exists(segment)) == (SERVED, 0)
    assert fresh.query_id != before.query_id
    assert json.loads(identity.read_text())["format"] == CHECKPOINT_FORMAT
    assert f"checkpoint is in format {format_ or 'unrecorded'}, this code keeps format {CHECKPOINT_FORMAT}" \
        in caplog.text


def _log_end_offset(checkpoint, batch_id: int, version: int, index: int) -> None:
    """Micro-batch ``batch_id``'s end offset as Spark logs Delta's: inside ``version`` when ``index`` >= 0."""
    (checkpoint / "offsets").mkdir(parents=True, exist_ok=True)
    end = {"sourceVersion": 1, "reservoirId": "r", "reservoirVersion": version, "index": index,
           "isStartingVersion": False}
    (checkpoint / "offsets" / str(batch_id)).write_text(f"v1\n{{}}\n{json.dumps(end)}")


def _plan(job: SpeedLayer, batch_id: int, summary: Summary) -> Plan:
    """The plan as ``SpeedLayer._process`` asks for it."""
    assert job._planner is not None
    inside = ends_inside_version(job.checkpoint, batch_id) is not None
    return job._planner.plan(batch_id, summary, ends_inside=inside)


def test_a_micro_batch_after_one_that_ended_inside_a_version_carries_its_tag_on(make_settings, redis_url: str) -> None:
    settings, pipeline, client, keys, _ = _served(make_settings, redis_url)
    job = SpeedLayer(None, settings, pipeline, redis_url=redis_url)  # type: ignore[arg-type]
    job._identity()
    checkpoint = settings.speed_checkpoint_path

    _log_end_offset(checkpoint, 3, 12, 1)  # micro-batch 3 ends inside version 12
    assert _plan(job, 3, Summary(12, [])).tag == 12
    assert _plan(job, 3, Summary(12, [])).tag == 12  # a replay: the same
    _log_end_offset(checkpoint, 4, 12, 3)  # the next part of version 12: still not its end
    assert _plan(job, 4, Summary(12, []))[2:] == (12, True)
    _log_end_offset(checkpoint, 5, 15, -1)  # the rest of 12 and more, to the end of version 14
    assert _plan(job, 5, Summary(14, []))[2:] == (12, True)
    assert _plan(job, 5, Summary(14, []))[2:] == (12, True)  # a replay: the same
    _log_end_offset(checkpoint, 6, 16, -1)  # committed micro-batch 5 ended where a version does
    assert _plan(job, 6, Summary(15, []))[2:] == (15, False)
