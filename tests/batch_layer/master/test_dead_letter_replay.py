"""Replaying dead letters after the event model was fixed: the letters valid now are appended once, the rest stay.

Files with bad lines are ingested with dead letters under the payments model; then the model is "fixed"
(an optional ``colour`` field, ``user_id`` optional) and the letters replayed. Oracle: the test's own list
of which lines the fixed model accepts, by a merchant name unique to each line; the master dataset is read
back with delta-rs and its rows counted by merchant, so a letter appended twice would show.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from batch_layer.master.dataset import MasterDataset
from batch_layer.master.dead_letter_replay import replay, replayed_ids
from batch_layer.master.dead_letters import SCHEMA, DeadLetter, DeadLetters
from batch_layer.master.engines import get_engine
from shared_logic.pipeline import EventModel
from shared_logic.pipelines.payments import Payments


class FixedPayment(EventModel):
    user_id: str | None = None
    merchant: str
    amount: float
    event_time: datetime | None = None
    colour: str | None = None


class FixedPayments(Payments):
    event_model = FixedPayment


LINES = [
    '{"user_id": "u1", "merchant": "ok-1", "amount": 1.5}',
    '{"user_id": "u2", "merchant": "bad-amount", "amount": "lots"}',
    '{"user_id": "u3", "merchant": "colour-json", "amount": 3, "colour": "red"}',
    "not json at all",
    '{"merchant": "no-user-json", "amount": 5, "event_time": "2026-01-01T00:00:00Z"}',
]
CSV = "user_id,merchant,amount,event_time\nu6,csv-bad,six,\n,no-user-csv,7,\nu8,csv-cells\n"
#: Merchants of the letters the fixed model accepts; the other letters stay invalid.
FIXED = {"colour-json", "no-user-json", "no-user-csv"}
STILL_BAD = {"bad-amount", "not json at all", "csv-bad", "csv-cells"}


def _merchants(master: MasterDataset) -> Counter[str]:
    rows = DeltaTable(str(master.path)).to_pyarrow_table().to_pylist()
    return Counter(r["merchant"] for r in rows if r["_kind"] == "event")


@pytest.fixture
def ingested(tmp_path: Path) -> tuple[MasterDataset, DeadLetters]:
    engine = get_engine("delta-rs")
    strict = MasterDataset(tmp_path / "master", Payments(), engine)
    letters = DeadLetters(tmp_path / "dead", "payments", engine)
    (tmp_path / "a.jsonl").write_text("\n".join(LINES) + "\n", encoding="utf-8")
    (tmp_path / "b.csv").write_text(CSV, encoding="utf-8")
    for name in ("a.jsonl", "b.csv"):
        strict.ingest_file(tmp_path / name, dead_letters=letters)
    assert len(letters.select()) == len(FIXED | STILL_BAD) and _merchants(strict) == Counter({"ok-1": 1})
    return strict, letters


def _letter_merchant(letter: dict) -> str:
    raw = str(letter["raw"])
    return next((m for m in FIXED | STILL_BAD if m in raw), raw)


def test_replay_appends_the_letters_valid_now_once_and_keeps_the_rest(ingested: tuple[MasterDataset, DeadLetters],
                                                                      tmp_path: Path) -> None:
    strict, letters = ingested
    master = MasterDataset(strict.path, FixedPayments(), get_engine("delta-rs"))
    chosen = letters.select()

    first = replay(master, chosen)

    by_id = {str(letter["id"]): letter for letter in chosen}
    assert {_letter_merchant(by_id[i]) for i in first.replayed} == FIXED
    assert {_letter_merchant(by_id[i]) for i in first.invalid} == STILL_BAD and first.already == []
    assert _merchants(master) == Counter({"ok-1": 1, **dict.fromkeys(FIXED, 1)})
    assert DeltaTable(str(master.path)).version() == first.version
    rows = {r["merchant"]: r for r in DeltaTable(str(master.path)).to_pyarrow_table().to_pylist()}
    assert rows["colour-json"]["colour"] == "red"  # the new field's column was added to the master
    colour_letter = next(letter for letter in chosen if "colour-json" in str(letter["raw"]))
    assert rows["colour-json"]["event_time"] == colour_letter["dead_at"]  # no event time: when it was refused
    assert rows["no-user-json"]["user_id"] is None and rows["no-user-csv"]["amount"] == 7.0
    assert replayed_ids(master, list(by_id)) == set(first.replayed)

    second = replay(master, letters.select())  # replaying again appends nothing twice

    assert second.replayed == [] and second.version is None and set(second.already) == set(first.replayed)
    assert set(second.invalid) == set(first.invalid)
    assert _merchants(master) == Counter({"ok-1": 1, **dict.fromkeys(FIXED, 1)})
    assert len(letters.select()) == len(FIXED | STILL_BAD)  # letters are never deleted: still-invalid ones stay


def test_replay_under_the_unchanged_model_appends_nothing(ingested: tuple[MasterDataset, DeadLetters]) -> None:
    strict, letters = ingested
    before = DeltaTable(str(strict.path)).version()

    result = replay(strict, letters.select(source="file"))

    assert result.replayed == [] and len(result.invalid) == len(FIXED | STILL_BAD)
    problems = {_letter_merchant(letter): result.invalid[str(letter["id"])] for letter in letters.select()}
    assert [p.field for p in problems["bad-amount"]] == ["amount"]
    assert [p.field for p in problems["csv-cells"]] == ["(record)"]
    assert DeltaTable(str(strict.path)).version() == before and _merchants(strict) == Counter({"ok-1": 1})


def test_a_selection_by_id_replays_only_those(ingested: tuple[MasterDataset, DeadLetters]) -> None:
    strict, letters = ingested
    master = MasterDataset(strict.path, FixedPayments(), get_engine("delta-rs"))
    [one] = [letter for letter in letters.select() if "no-user-csv" in str(letter["raw"])]
    assert letters.select(ids=[str(one["id"])]) == [one]

    result = replay(master, letters.select(ids=[str(one["id"])]))

    assert result.replayed == [one["id"]] and _merchants(master) == Counter({"ok-1": 1, "no-user-csv": 1})
    again = replay(master, letters.select(reason="required"))  # both letters of a missing user_id
    assert again.already == [one["id"]] and len(again.replayed) == 1
    assert _merchants(master) == Counter({"ok-1": 1, "no-user-csv": 1, "no-user-json": 1})


def test_a_transform_letter_is_never_replayed_its_event_is_in_the_master(ingested: tuple[MasterDataset, DeadLetters]
                                                                        ) -> None:
    strict, letters = ingested
    raw = '{"user_id": "u9", "merchant": "divided-by-zero", "amount": 1.0, "event_time": "2026-01-01T00:00:00Z"}'
    letters.keep([DeadLetter(raw=raw, source="transform", reason="division by zero", file=str(strict.path), line=0)])
    [letter] = letters.select(source="transform")

    result = replay(strict, [letter])

    assert result.replayed == [] and "in the master dataset already" in result.invalid[str(letter["id"])][0].message
    assert _merchants(strict) == Counter({"ok-1": 1})


def test_a_kafka_letter_replays_at_its_record_time_and_a_table_written_before_that_column_gains_it(
        tmp_path: Path) -> None:
    engine = get_engine("delta-rs")
    older = pa.schema([f for f in SCHEMA if f.name != "record_time"])  # the table as the first release wrote it
    engine.ensure_table(tmp_path / "dead", older, name="dead_letters_payments", change_feed=False)
    first = DeadLetter(raw="not json", source="file", reason="not JSON", file="a.jsonl", line=1).row()
    engine.append(tmp_path / "dead", pa.Table.from_pylist([first], schema=older))
    letters = DeadLetters(tmp_path / "dead", "payments", engine)
    [old] = letters.select()  # read (API, CLI, the batch's poison letters) before any append adds the column
    assert old["source"] == "file" and old["record_time"] is None and letters.page().total == 1
    sent = datetime(2026, 3, 1, 12, 30, 15, 250000, tzinfo=timezone.utc)  # the record's Kafka timestamp
    raw = '{"merchant": "from-kafka", "amount": 2.5}'  # no user_id (the fix makes it optional), no event_time

    letters.append([DeadLetter(raw=raw, source="kafka", reason="field 'user_id': required", topic="pay",
                               partition=3, offset=41, record_time=sent)])

    by_source = {letter["source"]: letter for letter in letters.select()}
    assert by_source["file"]["record_time"] is None and by_source["kafka"]["record_time"] == sent
    latest = engine.latest_version(tmp_path / "dead")  # a writer that saw the column missing before another added it
    assert engine.add_columns(tmp_path / "dead", [SCHEMA.field("record_time")], metadata={}) == latest, \
        "no second, empty metaData commit (it would fail other writers' appends in flight)"
    assert engine.latest_version(tmp_path / "dead") == latest
    master = MasterDataset(tmp_path / "master", FixedPayments(), engine)
    assert replay(master, [by_source["kafka"]]).replayed == [by_source["kafka"]["id"]]
    [event] = [r for r in DeltaTable(str(master.path)).to_pyarrow_table().to_pylist() if r["_kind"] == "event"]
    assert event["merchant"] == "from-kafka" and event["event_time"] == sent, "the record's time, not the refusal's"
