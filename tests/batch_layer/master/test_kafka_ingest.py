"""The Kafka ingest's micro-batch writer: valid records into the master once, bad ones into dead letters with their
coordinates, a replayed batch kept once, event time from the payload or else the record's Kafka timestamp.

Records are built as Spark's Kafka source hands them over (its columns, as Arrow); the writer's Spark side is
exercised end to end, with a real broker, in ``tests/kafka/``. The oracle parses the records with ``json``.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from batch_layer.errors import IngestError
from batch_layer.faults import injected
from batch_layer.master.dataset import MasterDataset
from batch_layer.master.dead_letters import DeadLetters
from batch_layer.master.kafka_ingest import MAX_RECORD_BYTES, KafkaSource, MasterWriter, partition_lags
from batch_layer.master.storage import CommitConflictError
from deploy.settings import Settings
from shared_logic.registry import load_pipeline

_KAFKA = pa.schema([("value", pa.binary()), ("topic", pa.string()), ("partition", pa.int32()),
                    ("offset", pa.int64()), ("timestamp", pa.timestamp("us", tz="UTC"))])
_T0 = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)


def _records(values: list[bytes | None], topic: str = "words", first_offset: int = 0) -> pa.Table:
    return pa.table({"value": values, "topic": [topic] * len(values), "partition": [i % 2 for i in range(len(values))],
                     "offset": [first_offset + i for i in range(len(values))],
                     "timestamp": [_T0 + timedelta(seconds=i) for i in range(len(values))]}, schema=_KAFKA)


@pytest.fixture
def writer(tmp_path: Path, make_settings: Any) -> MasterWriter:
    settings: Settings = make_settings()
    pipeline = load_pipeline("wordcount")
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    (checkpoint / "metadata").write_text(json.dumps({"id": "query-1"}))
    return MasterWriter(MasterDataset.open(settings, pipeline), DeadLetters.open(settings, pipeline.name), checkpoint)


def _master_rows(writer: MasterWriter) -> list[dict[str, Any]]:
    rows = DeltaTable(str(writer.master.path)).to_pyarrow_table().to_pylist()
    return sorted((r for r in rows if r["_kind"] == "event"), key=lambda r: (r["text"], r["event_time"]))


def test_valid_records_go_to_the_master_and_bad_ones_to_dead_letters_with_their_coordinates(writer: MasterWriter) -> None:
    values: list[bytes | None] = [
        b'{"text": "hello world", "event_time": "2026-01-02T03:04:05Z"}',
        b'{"text": "no time"}',
        b'{"text": 5}',                       # wrong type
        b"not json",
        None,                                 # a tombstone
        b'{"text": "caf\xe9"}',               # not UTF-8
        b'{"text": "extra", "user": "x"}',    # unknown field
    ]
    outcome = writer.write(_records(values, first_offset=40), batch_id=0)

    expected = sorted([{"text": "hello world", "event_time": datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)},
                       {"text": "no time", "event_time": _T0 + timedelta(seconds=1)}],  # its Kafka timestamp
                      key=lambda r: (r["text"], r["event_time"]))
    assert [{k: r[k] for k in ("text", "event_time")} for r in _master_rows(writer)] == expected
    letters = writer.dead_letters.page(limit=100).letters
    assert sorted((letter["offset"], letter["partition"], letter["topic"], letter["source"]) for letter in letters) == [
        (40 + i, i % 2, "words", "kafka") for i in (2, 3, 4, 5, 6)]
    by_offset = {letter["offset"]: letter for letter in letters}
    assert all(letter["record_time"] == _T0 + timedelta(seconds=letter["offset"] - 40) for letter in letters), \
        "each letter keeps its record's Kafka timestamp (a replay's event time)"
    assert by_offset[42]["field"] == "text" and by_offset[42]["raw"] == '{"text": 5}'
    assert "no value" in by_offset[44]["reason"]
    assert by_offset[45]["raw"] == '{"text": "caf\\xe9"}'
    assert by_offset[46]["field"] == "user"
    assert (outcome.read, outcome.appended, outcome.dead, outcome.replayed) == (7, 2, 5, False)


def test_a_replayed_batch_is_kept_once_in_the_master_and_in_the_dead_letters(writer: MasterWriter) -> None:
    batch = _records([b'{"text": "a"}', b"bad", b'{"text": "b"}'])
    first = writer.write(batch, batch_id=0)
    replay = writer.write(batch, batch_id=0)
    writer.write(_records([b'{"text": "c"}'], first_offset=3), batch_id=1)

    assert (first.appended, first.dead) == (2, 1)
    assert replay.replayed and (replay.appended, replay.dead) == (0, 0), "a replay counts nothing kept before"
    assert [r["text"] for r in _master_rows(writer)] == ["a", "b", "c"]
    assert writer.dead_letters.count() == 1


class _Crash(Exception):
    """The process dying at a fault point (its effects so far stay; nothing after it runs)."""


@pytest.mark.parametrize("point", ["kafka-before-master", "kafka-after-master", "kafka-after-letters"])
def test_a_batch_cut_short_at_any_point_and_replayed_is_kept_once(writer: MasterWriter, point: str) -> None:
    batch = _records([b'{"text": "a"}', b"bad", b'{"text": "b"}', b'{"text": 1}'])

    def crash() -> None:
        raise _Crash(point)

    with injected(point, crash), pytest.raises(_Crash):
        writer.write(batch, batch_id=0)
    again = MasterWriter(writer.master, writer.dead_letters, writer.checkpoint)  # the restarted process's
    again.write(batch, batch_id=0)  # Spark replays the batch under the same id
    again.write(_records([b'{"text": "c"}'], first_offset=4), batch_id=1)

    assert [r["text"] for r in _master_rows(writer)] == ["a", "b", "c"]
    assert sorted(letter["offset"] for letter in writer.dead_letters.page().letters) == [1, 3]


def test_a_commit_conflict_that_left_the_batch_out_fails_it_rather_than_dropping_it(
        writer: MasterWriter, monkeypatch: pytest.MonkeyPatch) -> None:
    """A conflict is taken for a replay only when the master records the batch's transaction: otherwise the batch
    fails, and Spark reads it again."""
    batch = _records([b'{"text": "a"}'])
    writer.master.ensure()  # a commit can only conflict on a table that exists

    def conflict(*args: Any, **kwargs: Any) -> int:
        raise CommitConflictError("lost to a concurrent transaction")  # an injected fault: nothing committed

    with monkeypatch.context() as patched:
        patched.setattr(MasterDataset, "append", conflict)
        with pytest.raises(IngestError, match="micro-batch 0 of kafka-ingest:query-1 lost a commit race"):
            writer.write(batch, batch_id=0)
    again = writer.write(batch, batch_id=0)
    assert (again.appended, again.replayed) == (1, False)
    assert [r["text"] for r in _master_rows(writer)] == ["a"]


def test_a_batch_of_dead_letters_only_is_kept_once_and_the_next_batch_still_lands(writer: MasterWriter) -> None:
    writer.write(_records([b"bad 1", b"bad 2"]), batch_id=0)
    writer.write(_records([b"bad 1", b"bad 2"]), batch_id=0)
    writer.write(_records([b'{"text": "after"}'], first_offset=2), batch_id=1)

    assert writer.dead_letters.count() == 2
    assert [r["text"] for r in _master_rows(writer)] == ["after"]


def test_an_oversized_record_is_a_dead_letter_and_a_missing_kafka_timestamp_is_no_time(writer: MasterWriter) -> None:
    records = _records([b'{"text": "big"}', b'{"text": "no timestamp"}', b'{"text": 1}'])
    records = records.set_column(4, "timestamp", pa.array([_T0] + 2 * [datetime(1969, 12, 31, 23, 59, 59, 999000,
                                                                             tzinfo=timezone.utc)], _KAFKA.field(4).type))
    records = records.append_column("size", pa.array([MAX_RECORD_BYTES + 1, 30, 11], pa.int32()))
    before = datetime.now(timezone.utc)

    outcome = writer.write(records, batch_id=0)

    [row] = _master_rows(writer)
    assert row["text"] == "no timestamp" and row["event_time"] >= before  # Kafka's -1: no record time
    big, untimed = sorted(writer.dead_letters.page().letters, key=lambda letter: letter["offset"])
    assert big["offset"] == 0 and "over the 65,536-byte limit" in big["reason"] and outcome.dead == 2
    assert (big["record_time"], untimed["offset"], untimed["record_time"]) == (_T0, 2, None), "Kafka's -1: no time"


def test_a_kafka_timestamp_past_year_9999_is_no_time_and_its_batch_lands(writer: MasterWriter) -> None:
    """A producer's microseconds sent as milliseconds (year ~55,000, which Python's datetime cannot hold): the
    records count as untimed, so one such record cannot fail its micro-batch at every replay."""
    records = _records([b'{"text": "from the future"}', b'{"text": 1}', b'{"text": "on time"}'])
    future = 1_700_000_000_000_000 * 1000  # 1.7e15 "ms" as Spark's microseconds
    stamps = pa.array([future, future, int(_T0.timestamp() * 1e6)], pa.int64()).cast(_KAFKA.field(4).type)
    before = datetime.now(timezone.utc)

    outcome = writer.write(records.set_column(4, "timestamp", stamps), batch_id=0)

    rows = {r["text"]: r["event_time"] for r in _master_rows(writer)}
    assert rows["on time"] == _T0 and rows["from the future"] >= before, "no record time: the time of ingest"
    [letter] = writer.dead_letters.page().letters
    assert (letter["offset"], letter["record_time"], outcome.appended, outcome.dead) == (1, None, 2, 1)


def test_a_source_reads_topics_or_a_pattern_and_passes_client_options_through() -> None:
    source = KafkaSource("b:9092", topics=("a", "b"), options={"security.protocol": "SASL_SSL"})
    options = source.reader_options()
    assert options["subscribe"] == "a,b" and options["kafka.security.protocol"] == "SASL_SSL"
    assert options["kafka.isolation.level"] == "read_committed" and options["maxOffsetsPerTrigger"] == "20000"
    assert "SASL" not in repr(source) and "SASL" not in source.described
    assert KafkaSource("b:9092", pattern="pay-.*").reader_options()["subscribePattern"] == "pay-.*"
    with pytest.raises(IngestError, match="exactly one"):
        KafkaSource("b:9092", topics=("a",), pattern="x")


def test_lag_per_partition_is_the_newest_offset_minus_the_offset_read_through() -> None:
    progress = {"sources": [{"endOffset": json.dumps({"t": {"0": 10, "1": 4}}),
                             "latestOffset": json.dumps({"t": {"0": 12, "1": 4}})}]}
    assert [(p.topic, p.partition, p.lag) for p in partition_lags(progress)] == [("t", 0, 2), ("t", 1, 0)]
    assert partition_lags(None) == []
