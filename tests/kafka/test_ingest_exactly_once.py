"""Kafka into the master, exactly once, with a real broker and `lambda-platform kafka ingest` killed -9 between a
micro-batch's master commit and its dead letters' commit (so before Spark's checkpoint records the batch done),
then restarted while more records arrive over two topics and five partitions. The master must hold every valid
record once, and the dead letters every bad record once, named by the topic, partition and offset the broker
acknowledged (the oracle: what was produced, in plain Python). The writer's other fault points are crashed in
process (``tests/batch_layer/master/test_kafka_ingest.py``): one SIGKILL per process kind proves the process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from tests.support import wait_for
from tests.support.kafka import Record, create_topic, produce, unique_topic

# One worker starts the session's broker, not both: tests taking `kafka_broker` are one group (tests/conftest.py).
pytestmark = [pytest.mark.slow, pytest.mark.uses_jvm_subprocess]



def _ingester(env: dict[str, str], fault: str | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "deploy.cli", "kafka", "ingest"],
                            env={**env, "LAMBDA_FAULT_POINTS": fault or ""},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _batch(topics: list[str], tag: str, good: int) -> dict[str, list[tuple[bytes, bytes]]]:
    """``good`` valid events per topic, each a unique text, and three bad records each (bad JSON, a wrong type,
    an unknown field)."""
    records: dict[str, list[tuple[bytes, bytes]]] = {}
    for t, topic in enumerate(topics):
        values = [json.dumps({"text": f"{tag}-{t}-{i}", "event_time": "2026-05-01T10:00:00Z"}) for i in range(good)]
        values += ["{not json", json.dumps({"text": 7}), json.dumps({"text": "x", "user": "u"})]
        records[topic] = [(str(i).encode(), v.encode()) for i, v in enumerate(values)]
    return records


def _produce(bootstrap: str, batch: dict[str, list[tuple[bytes, bytes]]]) -> list[tuple[str, Record]]:
    return [(topic, record) for topic, records in batch.items() for record in produce(bootstrap, topic, records)]


def _valid_event(value: bytes | None) -> dict[str, Any] | None:
    """The event a record holds if the wordcount model takes it (a text, an event time, nothing else)."""
    try:
        event = json.loads(value or b"")
    except ValueError:
        return None
    fits = isinstance(event, dict) and set(event) == {"text", "event_time"} and isinstance(event["text"], str)
    return event if fits else None


def _master_texts(data_dir: Path) -> list[str]:
    table = DeltaTable(str(data_dir / "master" / "wordcount")).to_pyarrow_table(columns=["text", "_kind"])
    return [row["text"] for row in table.to_pylist() if row["_kind"] == "event"]


def _dead_letters(data_dir: Path) -> list[dict[str, Any]]:
    folder = data_dir / "dead_letters" / "wordcount"
    return DeltaTable(str(folder)).to_pyarrow_table().to_pylist() if (folder / "_delta_log").exists() else []


def test_every_record_is_kept_once_when_the_ingester_is_killed_between_its_commits(kafka_broker: str, tmp_path: Path,
                                                                             redis_url: str) -> None:
    topics = [unique_topic("orders"), unique_topic("refunds")]
    create_topic(kafka_broker, topics[0], 3)
    create_topic(kafka_broker, topics[1], 2)
    data_dir = tmp_path / "data"
    env = {**os.environ, "LAMBDA_DATA_DIR": str(data_dir), "LAMBDA_REDIS_URL": redis_url,
           "LAMBDA_PIPELINE": "wordcount", "LAMBDA_SPARK_MASTER": "local[1]", "LAMBDA_SPARK_SHUFFLE_PARTITIONS": "1",
           "LAMBDA_KAFKA_BOOTSTRAP_SERVERS": kafka_broker, "LAMBDA_KAFKA_TOPICS": ",".join(topics),
           "LAMBDA_KAFKA_MAX_OFFSETS_PER_TRIGGER": "40", "LAMBDA_KAFKA_TRIGGER_SECONDS": "0.2"}
    produced = _produce(kafka_broker, _batch(topics, "first", good=30))
    killed = _ingester(env, "kafka-after-master")
    assert killed.wait(300) == -signal.SIGKILL, "the ingester did not reach its fault point"
    assert _master_texts(data_dir) and not _dead_letters(data_dir), "killed elsewhere than between the two commits"
    produced += _produce(kafka_broker, _batch(topics, "later", good=30))

    valid = [event["text"] for _, r in produced if (event := _valid_event(r.value)) is not None]
    bad = sorted((topic, r.partition, r.offset) for topic, r in produced if _valid_event(r.value) is None)
    ingester = _ingester(env)
    try:
        wait_for(lambda: len(_master_texts(data_dir)) >= len(valid) and len(_dead_letters(data_dir)) >= len(bad),
                 "the ingester to catch up", timeout=300, poll=1.0)
    finally:
        ingester.send_signal(signal.SIGTERM)
        assert ingester.wait(120) == 0, "the ingester did not stop cleanly on SIGTERM"

    texts = _master_texts(data_dir)
    assert Counter(texts) == Counter(valid), "the master does not hold every valid record exactly once"
    letters = _dead_letters(data_dir)
    assert sorted((d["topic"], d["partition"], d["offset"]) for d in letters) == bad
    assert {d["source"] for d in letters} == {"kafka"} and all(d["reason"] for d in letters)
