"""File ingest with dead letters: the valid lines committed, each bad one kept with its raw text, file, line and field.

Oracle: the test reads its own files (``json``, ``csv``, ``pyarrow.parquet``) and decides by the payments
model's rules, in plain Python, which records are events and which are bad (and the field at fault); the
master dataset and the dead-letter table are read back with delta-rs. Nothing is compared with the code's
own reading of the inputs. Without the option, ingest stays all or nothing.
"""

from __future__ import annotations

import csv
import io
import json
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from batch_layer.errors import SchemaChangeError
from batch_layer.master.backfill import backfill
from batch_layer.master.dataset import MasterDataset
from batch_layer.master.dead_letters import DeadLetters, DeadLetterWriteError
from batch_layer.master.engines import get_engine
from shared_logic import EventValidationError, load_pipeline

Event = tuple[str, str, float]

JSONL_LINES = [
    '{"user_id": "u1", "merchant": "m1", "amount": 1.5, "event_time": "2026-01-01T00:00:00Z"}',
    '{"user_id": "u2", "merchant": "m2", "amount": "lots"}',
    "",
    '{"user_id": "u3", "merchant": "m3", "amount": 3, "colour": "red"}',
    "not json at all",
    '{"user_id": "u4", "merchant": "m4", "amount": 4.25}',
    '{"merchant": "m5", "amount": 5}',
    '{"user_id": "u6", "merchant": "m6", "amount": 6, "event_time": 1700000000}',
    '{"user_id": "u7", "merchant": "m7", "amount": -7.5, "event_time": "2026-01-02T03:04:05+01:00"}',
]


def _oracle(values: dict[str, Any], *, text_cells: bool) -> tuple[Event | None, str | None]:
    """The payments model's rules in plain Python: (event, None) or (None, the field at fault)."""
    unknown = [k for k in values if k not in ("user_id", "merchant", "amount", "event_time")]
    for name in ("user_id", "merchant"):
        if not isinstance(values.get(name), str):
            return None, name
    amount = values.get("amount")
    if text_cells and isinstance(amount, str):
        try:
            amount = float(amount)
        except ValueError:
            return None, "amount"
    if isinstance(amount, bool) or not isinstance(amount, (int, float)):
        return None, "amount"
    when = values.get("event_time")
    if when is not None and not isinstance(when, str):
        return None, "event_time"
    if unknown:
        return None, unknown[0]
    return (values["user_id"], values["merchant"], float(amount)), None


def _oracle_jsonl(lines: list[str]) -> tuple[Counter[Event], dict[int, tuple[str, str]]]:
    """Expected events, and line number -> (raw text, field at fault) of each bad line."""
    good: Counter[Event] = Counter()
    bad: dict[int, tuple[str, str]] = {}
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            values = json.loads(text)
        except ValueError:
            bad[number] = (text, "(event)")
            continue
        event, field = _oracle(values, text_cells=False)
        if event is None:
            bad[number] = (text, str(field))
        else:
            good[event] += 1
    return good, bad


@pytest.fixture
def engine(request: pytest.FixtureRequest, storage_engine: str) -> str:
    if storage_engine == "delta-spark":
        request.getfixturevalue("spark")  # the JVM engine works through the running session
    return storage_engine


def _master(tmp_path: Path, engine: str) -> MasterDataset:
    return MasterDataset(tmp_path / "master", load_pipeline("payments"), get_engine(engine))


def _letters(tmp_path: Path, engine: str) -> DeadLetters:
    return DeadLetters(tmp_path / "dead", "payments", get_engine(engine))


def _stored(master: MasterDataset) -> Counter[Event]:
    rows = DeltaTable(str(master.path)).to_pyarrow_table().to_pylist()
    return Counter((r["user_id"], r["merchant"], r["amount"]) for r in rows if r["_kind"] == "event")


def _kept(letters: DeadLetters) -> list[dict[str, Any]]:
    try:
        table = DeltaTable(str(letters.path))
    except Exception:  # no table: nothing kept
        return []
    return sorted(table.to_pyarrow_table().to_pylist(), key=lambda r: (r["file"], r["line"]))


def _version(path: Path) -> int | None:
    try:
        return DeltaTable(str(path)).version()
    except Exception:
        return None


def test_jsonl_default_refuses_all_and_the_option_keeps_the_good_lines_and_the_bad_ones_as_letters(
        engine: str, tmp_path: Path) -> None:
    file = tmp_path / "mixed.jsonl"
    file.write_text("\n".join(JSONL_LINES) + "\n", encoding="utf-8")
    good, bad = _oracle_jsonl(file.read_text(encoding="utf-8").split("\n"))
    assert sum(good.values()) == 3 and sorted(bad) == [2, 4, 5, 7, 8]
    master, letters = _master(tmp_path, engine), _letters(tmp_path, engine)

    with pytest.raises(EventValidationError) as caught:  # the default: all or nothing, every problem listed
        master.ingest_file(file)
    assert sorted(int(p.location.split()[1]) for p in caught.value.problems) == sorted(bad)
    assert _version(master.path) is None or not _stored(master)
    assert _kept(letters) == []

    result = master.ingest_file(file, dead_letters=letters)

    assert result.events == sum(good.values()) and result.dead_letters == len(bad)
    assert _stored(master) == good and DeltaTable(str(master.path)).version() == result.version
    kept = _kept(letters)
    assert [(r["line"], r["raw"], r["field"]) for r in kept] == [(n, raw, field) for n, (raw, field) in sorted(bad.items())]
    assert {r["source"] for r in kept} == {"file"} and {r["file"] for r in kept} == {str(file.resolve())}
    assert all(r["reason"].startswith(f"field {r['field']!r}: ") for r in kept)
    assert len({r["id"] for r in kept}) == len(kept)


CSV_TEXT = (
    "user_id,merchant,amount,event_time\r\n"
    "u1,m1,12.5,2026-01-01T00:00:00Z\r\n"
    "u2,m2,twelve,\r\n"
    "\r\n"
    'u3,"a ""quoted""\r\ntwo-line name",0.25,\r\n'
    "u4,m4\r\n"
    ",m5,5,\r\n"
    "u6,m6,6,2026-01-01 08:00:00\r\n"
)


def test_csv_bad_records_keep_their_header_and_text_and_first_line(engine: str, tmp_path: Path) -> None:
    file = tmp_path / "mixed.csv"
    file.write_bytes(CSV_TEXT.encode())
    # Oracle: the csv module reads the records; a record's first line is counted from the text before it.
    header_line, rest = CSV_TEXT.split("\r\n", 1)
    good: Counter[Event] = Counter()
    bad: dict[int, tuple[str, str]] = {}
    line = 2
    for chunk in _records(rest):
        row = next(csv.reader(io.StringIO(chunk)), [])
        if row:
            cells = dict(zip(header_line.split(","), row)) if len(row) == 4 else None
            event, field = _oracle({k: v for k, v in cells.items() if v != ""}, text_cells=True) if cells else (None, "(record)")
            if event is None:
                bad[line] = (f"{header_line}\r\n{chunk.rstrip()}", str(field))
            else:
                good[event] += 1
        line += chunk.count("\n")
    assert sorted(bad) == [3, 7, 8] and sum(good.values()) == 3
    master, letters = _master(tmp_path, engine), _letters(tmp_path, engine)

    result = master.ingest_file(file, dead_letters=letters)

    assert (result.events, result.dead_letters) == (3, 3) and _stored(master) == good
    kept = _kept(letters)
    assert [(r["line"], r["raw"], r["field"]) for r in kept] == [(n, raw, field) for n, (raw, field) in sorted(bad.items())]


def _records(text: str) -> list[str]:
    """The records of CSV text (a quoted line end stays inside its record), each with its line ends."""
    records, current, quoted = [], "", False
    for piece in text.splitlines(keepends=True):
        current += piece
        quoted ^= piece.count('"') % 2 == 1
        if not quoted:
            records.append(current)
            current = ""
    return records


def test_parquet_bad_rows_are_letters_named_by_row_with_their_values_as_json(engine: str, tmp_path: Path) -> None:
    file = tmp_path / "rows.parquet"
    t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
    pq.write_table(pa.table({"user_id": ["u1", None, "u3", "u4"], "merchant": ["m1", "m2", "m3", None],
                             "amount": [1.0, 2.0, 3.0, 4.0], "event_time": [t0, t0, None, t0]}), file, row_group_size=2)
    rows = pq.read_table(file).to_pylist()
    good = Counter((r["user_id"], r["merchant"], r["amount"]) for r in rows if r["user_id"] and r["merchant"])
    bad = {i: r for i, r in enumerate(rows, start=1) if not (r["user_id"] and r["merchant"])}
    master, letters = _master(tmp_path, engine), _letters(tmp_path, engine)

    result = master.ingest_file(file, dead_letters=letters)

    assert (result.events, result.dead_letters) == (2, 2) and _stored(master) == good
    kept = _kept(letters)
    assert [r["line"] for r in kept] == sorted(bad) and [r["field"] for r in kept] == ["user_id", "merchant"]
    for letter in kept:
        values = json.loads(letter["raw"])
        expected = bad[letter["line"]]
        assert values == {**expected, "event_time": expected["event_time"].isoformat()}


def test_a_rerun_appends_the_good_lines_again_and_keeps_no_second_letter(tmp_path: Path) -> None:
    file = tmp_path / "mixed.jsonl"
    file.write_text("\n".join(JSONL_LINES) + "\n", encoding="utf-8")
    good, bad = _oracle_jsonl(JSONL_LINES)
    master, letters = _master(tmp_path, "delta-rs"), _letters(tmp_path, "delta-rs")
    master.ingest_file(file, dead_letters=letters)
    letters_version = _version(letters.path)

    again = master.ingest_file(file, dead_letters=letters)

    assert again.dead_letters == len(bad)  # every bad line is reported again ...
    assert _stored(master) == good + good  # ... the good lines are appended again (ingest is not idempotent) ...
    assert len(_kept(letters)) == len(bad) and _version(letters.path) == letters_version  # ... no letter twice


def test_a_file_of_bad_lines_only_commits_nothing_to_the_master(tmp_path: Path) -> None:
    file = tmp_path / "bad.jsonl"
    file.write_text('{"user_id": 1}\n[]\n', encoding="utf-8")
    master, letters = _master(tmp_path, "delta-rs"), _letters(tmp_path, "delta-rs")
    master.ensure()
    before = _version(master.path)

    result = master.ingest_file(file, dead_letters=letters)

    assert (result.events, result.dead_letters, result.version) == (0, 2, before) and _version(master.path) == before
    assert [r["line"] for r in _kept(letters)] == [1, 2]


def test_a_failed_master_commit_keeps_no_letters(tmp_path: Path) -> None:
    # A master the event model cannot follow (amount is text there): ensure refuses before the commit.
    master, letters = _master(tmp_path, "delta-rs"), _letters(tmp_path, "delta-rs")
    schema = master.schema.set(master.schema.get_field_index("amount"), pa.field("amount", pa.string()))
    get_engine("delta-rs").ensure_table(master.path, schema, name="master_payments", change_feed=True)
    file = tmp_path / "mixed.jsonl"
    file.write_text("\n".join(JSONL_LINES) + "\n", encoding="utf-8")

    with pytest.raises(SchemaChangeError):
        master.ingest_file(file, dead_letters=letters)

    assert _kept(letters) == [] and _version(letters.path) is None and _version(master.path) == 0


def test_letters_that_cannot_be_kept_after_the_master_commit_are_reported_with_the_version(tmp_path: Path) -> None:
    file = tmp_path / "mixed.jsonl"
    file.write_text("\n".join(JSONL_LINES) + "\n", encoding="utf-8")
    good, bad = _oracle_jsonl(JSONL_LINES)
    master = _master(tmp_path, "delta-rs")
    blocked = tmp_path / "dead"
    blocked.write_text("a file where the dead-letter table should be")  # no table can be created there

    with pytest.raises(DeadLetterWriteError) as caught:
        master.ingest_file(file, dead_letters=DeadLetters(blocked, "payments", get_engine("delta-rs")))

    assert _stored(master) == good
    message = str(caught.value)
    assert f"committed at master version {DeltaTable(str(master.path)).version()}" in message
    assert all(f"line {n}:" in message for n in bad) and "do not ingest the file again" in message


def test_backfill_of_several_files_keeps_letters_of_source_backfill(tmp_path: Path) -> None:
    first, second = tmp_path / "a.jsonl", tmp_path / "b.csv"
    first.write_text("\n".join(JSONL_LINES) + "\n", encoding="utf-8")
    second.write_bytes(CSV_TEXT.encode())
    master, letters = _master(tmp_path, "delta-rs"), _letters(tmp_path, "delta-rs")

    done = backfill(master, [first, second], dead_letters=letters)

    assert [(d.events, d.dead_letters) for d in done] == [(3, 5), (3, 3)]
    kept = _kept(letters)
    assert Counter((r["source"], Path(r["file"]).name) for r in kept) == Counter({("backfill", "a.jsonl"): 5,
                                                                                 ("backfill", "b.csv"): 3})
    [single] = backfill(master, [first], dead_letters=letters)
    assert single.dead_letters == 5 and Counter(r["source"] for r in _kept(letters)) == {"backfill": 8, "file": 5}


def test_structural_problems_still_refuse_the_whole_file(tmp_path: Path) -> None:
    header = tmp_path / "header.csv"
    header.write_text("user_id,amount,colour\nu1,1,red\n", encoding="utf-8")
    master, letters = _master(tmp_path, "delta-rs"), _letters(tmp_path, "delta-rs")

    with pytest.raises(EventValidationError) as caught:
        master.ingest_file(header, dead_letters=letters)

    assert {(p.location, p.field) for p in caught.value.problems} == {("line 1", "colour"), ("line 1", "merchant")}
    assert _version(master.path) is None and _kept(letters) == []
