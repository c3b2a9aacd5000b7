"""Duplicates are never counted: batch and speed layer leave out the same repeats, so merged answers are exact.

``tests.support.dedup_pipeline`` declares ``payment_id``. Payments are committed in several versions
with repeats inside one commit (identical copies: a client resending a line), across commits (a
producer retrying, sometimes with another amount: the first in master order counts) and across the
batch barrier (a resend of a payment the served generation holds). A batch run, the speed layer, a
second run while it runs, and a restart of the speed layer (it rebuilds what it remembers from the
event-id index): at each step every user's answer equals the oracle over the commits at the version
it names.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from deltalake import DeltaTable

from batch_layer.faults import injected
from batch_layer.master.dataset import MasterDataset
from batch_layer.master.event_ids import EventIdIndex
from batch_layer.recompute.job import run_batch
from deploy.settings import Settings
from serving.store.keys import Keys
from shared_logic.registry import load_pipeline
from tests.support import web
from tests.support.dedup_pipeline import VIEW, oracle
from tests.support.speed import running_speed_layer, wait_caught_up

pytestmark = pytest.mark.slow

PIPELINE = "tests.support.dedup_pipeline"


def _pay(pid: str, user: str, amount: float) -> dict[str, Any]:
    return {"payment_id": pid, "user_id": user, "amount": amount, "event_time": "2026-11-01T10:00:00Z"}


FIRST = [_pay("p1", "ann", 10.0), _pay("p2", "bob", 5.0), _pay("p2", "bob", 5.0), _pay("p3", "ann", 1.0)]
SECOND = [_pay("p2", "bob", 7.0), _pay("p4", "cy", 2.0), _pay("p4", "cy", 2.0), _pay("p5", "bob", 3.0)]
AFTER = [_pay("p1", "ann", 10.0), _pay("p6", "ann", 4.0), _pay("p6", "ann", 4.0), _pay("p7", "dee", 8.0)]
LATER = [_pay("p7", "dee", 9.0), _pay("p3", "ann", 1.0), _pay("p8", "cy", 6.0)]
RESTARTED = [_pay("p8", "cy", 6.0), _pay("p9", "dee", 1.5), _pay("p5", "bob", 3.0)]


class _Died(Exception):
    """A batch run killed at a fault point (in process)."""


def _die() -> None:
    raise _Died


def _problems(http: httpx.Client, commits: Sequence[list[dict[str, Any]]], version: int) -> list[str]:
    want = oracle(commits)
    problems = []
    for user, (count, total) in sorted(want.items()):
        body = http.get(f"/v1/views/{VIEW}/keys/{user}").json()
        value = body.get("value") or {}
        if body.get("version") != version or value.get("count") != count or value.get("sum_amount") != pytest.approx(total):
            problems.append(f"{user}: want count {count} sum {total} at {version}, got {body}")
    return problems


def test_batch_and_speed_leave_out_the_same_duplicates(
        spark: Any, make_settings: Callable[..., Settings], api: Callable[..., Any], tmp_path: Path) -> None:
    settings = make_settings(pipeline=PIPELINE, speed_trigger_seconds=0.2, speed_driver_rows=10_000)
    pipeline = load_pipeline(PIPELINE)
    master = MasterDataset.open(settings, pipeline)
    commits: list[list[dict[str, Any]]] = []

    def commit(events: list[dict[str, Any]]) -> int:
        commits.append(events)
        return master.append(pipeline.schema.validate(events))

    commit(FIRST)
    commit(SECOND)
    result = run_batch(spark, settings, pipeline, redis_url=settings.redis_url)
    assert {s.name: s.count for s in result.stages}["dedup"] == 3  # p2 copied and resent, p4 copied
    client = redis.Redis.from_url(settings.redis_url)
    with api(pipeline=PIPELINE) as server, web.client(base_url=server.base_url, timeout=30) as http:
        assert not _problems(http, commits, result.generation)
        in_tasks = settings.model_copy(update={"speed_driver_rows": 0})
        replayed: list[str] = []

        def fail_once() -> None:  # the micro-batch's increments are written, Spark's offsets not: it is replayed
            if not replayed:
                replayed.append("speed-after-write")
                raise redis.exceptions.ConnectionError("Error 111 connecting to Redis (injected after the write)")

        with injected("speed-after-write", fail_once), running_speed_layer(spark, settings, pipeline) as thread:
            commit(AFTER)
            version = wait_caught_up(settings, speed=thread)
            assert replayed, "the fault was not injected"
            assert not _problems(http, commits, version)
            assert int(client.hget(Keys(pipeline.name).speed, "last_batch_duplicates") or 0) == 2
            assert 'lambda_speed_last_batch_duplicates{pipeline="dedup_payments"} 2.0' in http.get("/metrics").text

            with injected("before-flip", _die), pytest.raises(_Died):  # the index extended, nothing flipped
                run_batch(spark, settings, pipeline, redis_url=settings.redis_url)
            commit([_pay("p6", "ann", 4.0), _pay("p10", "ann", 2.5)])
            version = wait_caught_up(settings, speed=thread)
            assert not _problems(http, commits, version)
            again = run_batch(spark, settings, pipeline, redis_url=settings.redis_url)
            commit(LATER)
            version = wait_caught_up(settings, speed=thread)
            assert again.flipped and version > again.generation
            assert not _problems(http, commits, version)

        with running_speed_layer(spark, in_tasks, pipeline) as thread:  # a restart: the horizon read again
            commit(RESTARTED)
            version = wait_caught_up(in_tasks, speed=thread)
            assert not _problems(http, commits, version)


def test_declared_on_a_trimmed_master_the_index_is_seeded_and_both_layers_agree(
        spark: Any, make_settings: Callable[..., Settings], api: Callable[..., Any], tmp_path: Path) -> None:
    """The log no longer holds the first commits (upkeep trimmed it): the first run seeds the index at its
    barrier, taking the snapshot's events as one version (repeats there are identical copies, so the
    oracle's first-in-order is the seed's choice too); the speed layer then decides resends of them alike."""
    settings = make_settings(pipeline=PIPELINE, speed_trigger_seconds=0.2, speed_driver_rows=10_000)
    pipeline = load_pipeline(PIPELINE)
    master = MasterDataset.open(settings, pipeline)
    commits = [FIRST, [_pay("p2", "bob", 5.0), _pay("p4", "cy", 2.0), _pay("p4", "cy", 2.0)]]
    for events in commits:
        master.append(pipeline.schema.validate(events))
    DeltaTable(str(settings.master_path)).create_checkpoint()
    assert master.trim_log(master.latest_version()).deleted  # versions 0 and 1 are gone from the log
    result = run_batch(spark, settings, pipeline, redis_url=settings.redis_url)
    state = EventIdIndex(settings.event_ids_uri, master, "payment_id").state()
    assert state is not None and state.seed == state.through == result.generation
    with api(pipeline=PIPELINE) as server, web.client(base_url=server.base_url, timeout=30) as http:
        assert not _problems(http, commits, result.generation)
        with running_speed_layer(spark, settings, pipeline) as thread:
            commits.append(AFTER)
            master.append(pipeline.schema.validate(AFTER))
            version = wait_caught_up(settings, speed=thread)
            assert not _problems(http, commits, version)
