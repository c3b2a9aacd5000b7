"""Duplicates are counted once whatever door they came in by: a file ingest (a resent file), the Kafka
ingest's writer (a producer's retry at another offset, a replayed micro-batch) and HTTP ingest (a client's
resend without an Idempotency-Key). One batch run over the master; every user's answer equals the oracle:
in master order, each payment id's first payment counts (``tests.support.dedup_pipeline.oracle``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from batch_layer.master.dataset import MasterDataset
from batch_layer.master.dead_letters import DeadLetters
from batch_layer.master.kafka_ingest import MasterWriter
from batch_layer.recompute.job import run_batch
from deploy.settings import Settings
from shared_logic.registry import load_pipeline
from tests.support import ingest_file, web
from tests.support.dedup_pipeline import VIEW, oracle

pytestmark = pytest.mark.slow  # over 10 s each: the end-to-end tier

PIPELINE = "tests.support.dedup_pipeline"
_KAFKA = pa.schema([("value", pa.binary()), ("topic", pa.string()), ("partition", pa.int32()),
                    ("offset", pa.int64()), ("timestamp", pa.timestamp("us", tz="UTC"))])


def _pay(pid: str, user: str, amount: float) -> dict[str, Any]:
    return {"payment_id": pid, "user_id": user, "amount": amount, "event_time": "2026-11-02T08:00:00Z"}


def _records(events: list[dict[str, Any]], first_offset: int) -> pa.Table:
    n = len(events)
    return pa.table({"value": [json.dumps(e).encode() for e in events], "topic": ["pay"] * n, "partition": [0] * n,
                     "offset": list(range(first_offset, first_offset + n)), "timestamp": [None] * n}, schema=_KAFKA)


def test_duplicates_from_every_door_are_counted_once(spark: Any, make_settings: Callable[..., Settings],
                                                     api: Callable[..., Any], tmp_path: Path) -> None:
    settings = make_settings(pipeline=PIPELINE)
    pipeline = load_pipeline(PIPELINE)
    commits: list[list[dict[str, Any]]] = []

    a_file = [_pay("f1", "ann", 1.0), _pay("f2", "bob", 2.0), _pay("f1", "ann", 1.0)]
    for attempt in ("first", "resent"):  # the same file twice
        ingest_file(settings, a_file, tmp_path / f"{attempt}.jsonl")
        commits.append(a_file)

    checkpoint = tmp_path / "kafka-checkpoint"
    checkpoint.mkdir()
    (checkpoint / "metadata").write_text(json.dumps({"id": "query-1"}))
    writer = MasterWriter(MasterDataset.open(settings, pipeline), DeadLetters.open(settings, pipeline.name), checkpoint)
    batch = [_pay("k1", "cy", 3.0), _pay("f2", "bob", 2.0)]       # f2 came by file already
    retried = [_pay("k1", "cy", 3.0), _pay("k2", "cy", 4.0)]      # the producer retried k1 at another offset
    for events, offset, batch_id in ((batch, 0, 0), (batch, 0, 0), (retried, 2, 1)):  # batch 0 replayed
        if not writer.write(_records(events, offset), batch_id=batch_id).replayed:
            commits.append(events)

    key = "a-test-key-of-sufficient-length-0123456789"
    with api(pipeline=PIPELINE, api_keys={key: ["read", "ingest"]}) as server, \
            web.client(base_url=server.base_url, timeout=30, headers={"Authorization": f"Bearer {key}"}) as http:
        for events in ([_pay("h1", "dee", 5.0), _pay("k2", "cy", 9.0)], [_pay("h1", "dee", 5.0)]):  # resent by hand
            response = http.post("/v1/events", json=events)
            assert response.status_code == 202, response.text
            commits.append(events)
        result = run_batch(spark, settings, pipeline, redis_url=settings.redis_url)
        dropped = {s.name: s.count for s in result.stages}["dedup"]
        assert dropped == sum(map(len, commits)) - len({e["payment_id"] for c in commits for e in c})
        for user, (count, total) in oracle(commits).items():
            value = http.get(f"/v1/views/{VIEW}/keys/{user}").json()["value"]
            assert (value["count"], value["sum_amount"]) == (count, pytest.approx(total)), user
