"""Bulk backfill of CSV and Parquet files and folders: one master version per file, all or nothing per file.

Oracle: pandas reads the same input files (CSV as text, Parquet as written) and plain Python turns
them into the expected events; the master is read back with delta-rs, version by version. Nothing
is compared with the code's own reading of the inputs.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from batch_layer.errors import IngestError
from batch_layer.master.backfill import FileIngested, backfill
from batch_layer.master.dataset import MasterDataset
from batch_layer.master.engines import get_engine
from batch_layer.master.file_formats import SourceFile
from shared_logic import EventValidationError, load_pipeline

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
Event = tuple[str, str, float, datetime | None]


@pytest.fixture
def master(request: pytest.FixtureRequest, storage_engine: str, tmp_path: Path) -> MasterDataset:
    if storage_engine == "delta-spark":
        request.getfixturevalue("spark")  # the JVM engine works through the running session
    return MasterDataset(tmp_path / "master", load_pipeline("payments"), get_engine(storage_engine))


def _stored(master: MasterDataset, version: int | None = None) -> Counter[Event]:
    rows = DeltaTable(str(master.path), version=version).to_pyarrow_table().to_pylist()
    return Counter((r["user_id"], r["merchant"], r["amount"], r["event_time"]) for r in rows if r["_kind"] == "event")


def _version(master: MasterDataset) -> int | None:
    try:
        return DeltaTable(str(master.path)).version()
    except Exception:  # no table yet
        return None


def _parquet_events(path: Path, start: int, n: int) -> None:
    """A Parquet file whose column types differ from the master's but read safely as them, in row groups of 16."""
    pq.write_table(pa.table({
        "user_id": pa.array([f"u{i % 5}" for i in range(start, start + n)]).dictionary_encode(),
        "merchant": pa.array([f"m{i}" for i in range(start, start + n)], pa.large_string()),
        "amount": pa.array(range(start, start + n), pa.int32()),
        "event_time": pa.array([T0 + timedelta(minutes=i) for i in range(start, start + n)], pa.timestamp("ns")),
    }), path, row_group_size=16)


def _oracle_parquet(path: Path) -> Counter[Event]:
    frame = pd.read_parquet(path)
    return Counter((str(r.user_id), str(r.merchant), float(r.amount), r.event_time.to_pydatetime().replace(tzinfo=timezone.utc))
                   for r in frame.itertuples())


@pytest.mark.slow  # over 10 s: the end-to-end tier
def test_parquet_folder_backfill_equals_the_oracle_one_version_per_file(master: MasterDataset, storage_engine: str,
                                                                        tmp_path: Path) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    for i, name in enumerate(["c.parquet", "a.parquet", "b.parquet"]):
        _parquet_events(folder / name, i * 100, 40 + i)
    (folder / "_SUCCESS").write_text("")  # what Spark leaves beside its output: not an event file
    master.ensure()
    before = DeltaTable(str(master.path)).version()

    done = backfill(master, [folder])

    order = ["a.parquet", "b.parquet", "c.parquet"]  # sorted by name
    assert [d.source.path.name for d in done] == order
    assert [d.version for d in done] == [before + 1, before + 2, before + 3]
    expected: Counter[Event] = Counter()
    for name, d in zip(order, done):
        file_events = _oracle_parquet(folder / name)
        assert d.events == sum(file_events.values())
        assert _stored(master, d.version) - _stored(master, d.version - 1) == file_events  # that file, in its version
        expected += file_events
    assert _stored(master) == expected and DeltaTable(str(master.path)).version() == before + 3
    if storage_engine == "delta-spark":  # committed by Spark, not by the delta-rs fallback
        writers = {h["version"]: h.get("engineInfo", "") for h in DeltaTable(str(master.path)).history()}
        assert all("Spark" in writers[d.version] for d in done), writers


CSV_TEXT = """user_id,merchant,amount,event_time
u1,m1,12.5,2026-01-01T00:00:00Z
u2,"m2, the shop",3,2026-01-01T00:10:00+01:00

u3,"a ""quoted""
two-line name",0.25,
u1,m4,-7,2026-01-01 08:00:00
"""


def _oracle_csv(path: Path) -> tuple[Counter[Event], int]:
    """Expected events (event time None where the cell is empty) and how many have no event time."""
    frame = pd.read_csv(path, dtype=str, keep_default_na=False, skip_blank_lines=True)
    events: Counter[Event] = Counter()
    for r in frame.itertuples():
        when = pd.Timestamp(r.event_time).to_pydatetime() if r.event_time else None
        when = when.replace(tzinfo=timezone.utc) if when is not None and when.tzinfo is None else when
        events[(r.user_id, r.merchant, float(r.amount), when.astimezone(timezone.utc) if when else None)] += 1
    return events, sum(1 for r in frame.itertuples() if not r.event_time)


def test_csv_file_equals_the_oracle(master: MasterDataset, tmp_path: Path) -> None:
    file = tmp_path / "events.csv"
    file.write_text(CSV_TEXT, encoding="utf-8")
    expected, untimed = _oracle_csv(file)
    assert untimed == 1

    [done] = backfill(master, [file])

    assert done.events == sum(expected.values()) == 4
    stored = _stored(master, done.version)
    stamps = {e[3] for e in stored if e[:3] == ("u3", 'a "quoted"\ntwo-line name', 0.25)}
    assert len(stamps) == 1 and None not in stamps  # the empty cell: set to the ingest time
    stamp = stamps.pop()
    assert stored == Counter({(e[0], e[1], e[2], e[3] or stamp): n for e, n in expected.items()})


def test_a_bad_csv_row_names_file_line_and_field_and_writes_nothing_of_the_file(master: MasterDataset,
                                                                                 tmp_path: Path) -> None:
    good, later = tmp_path / "1-good.csv", tmp_path / "3-later.parquet"
    good.write_text(CSV_TEXT, encoding="utf-8")
    _parquet_events(later, 0, 3)
    lines = CSV_TEXT.splitlines()
    lines.append("u9,m9,nine,2026-01-01T00:00:00Z")  # line 8: the blank line and the two-line record count
    lines.append(",m10,1,2026-01-01T00:00:00Z")       # line 9: an empty cell is an absent field
    bad = tmp_path / "2-bad.csv"
    bad.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert _version(master) is None

    progress = _Recorder()
    with pytest.raises(EventValidationError) as caught:
        backfill(master, [tmp_path], progress=progress)

    assert [(p.location, p.field) for p in caught.value.problems] == [("line 8", "amount"), ("line 9", "user_id")]
    message = str(caught.value)
    assert str(bad) in message and "line 8, field 'amount'" in message and "nothing was written" in message
    # The good file before it is committed (one version), the bad one and the one after are not.
    [committed] = progress.committed_files
    assert committed.source.path == good and _version(master) == committed.version
    assert _stored(master) == _stored(master, committed.version) and sum(_stored(master).values()) == 4
    assert [s.path for s in progress.not_written] == [bad, later]


def test_structure_and_extensions_are_checked_before_anything_is_written(master: MasterDataset, tmp_path: Path) -> None:
    good = tmp_path / "good.csv"
    good.write_text(CSV_TEXT, encoding="utf-8")
    notes = tmp_path / "notes.txt"
    notes.write_text("not events")
    with pytest.raises(IngestError, match=r"notes\.txt: unknown extension '\.txt'.*\.parquet, \.csv, \.jsonl, \.json"):
        backfill(master, [good, notes])
    assert _version(master) is None

    header = tmp_path / "header.csv"
    header.write_text("user_id,amount,colour\nu1,1,red\n")
    with pytest.raises(EventValidationError) as caught:
        backfill(master, [good, header])  # the good file comes first, and is not written either
    assert sorted((p.location, p.field) for p in caught.value.problems) == [("line 1", "colour"), ("line 1", "merchant")]
    assert str(header) in str(caught.value) and _version(master) is None

    typed = tmp_path / "typed.parquet"
    pq.write_table(pa.table({"user_id": ["u"], "merchant": ["m"], "amount": ["1.5"]}), typed)
    with pytest.raises(EventValidationError) as caught:
        backfill(master, [good, typed])
    assert [(p.location, p.field) for p in caught.value.problems] == [("schema", "amount")]
    assert str(typed) in str(caught.value) and _version(master) is None


def test_format_override_and_bad_parquet_rows(master: MasterDataset, tmp_path: Path) -> None:
    text = tmp_path / "events.txt"
    text.write_text(CSV_TEXT, encoding="utf-8-sig")  # with a byte-order mark, as spreadsheets export
    [done] = backfill(master, [text], file_format="csv")
    assert done.events == 4

    rows = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"user_id": ["u", None, "w"], "merchant": ["m", "m", "m"],
                             "amount": [1.0, 2.0, float("nan")]}), rows, row_group_size=1)
    with pytest.raises(EventValidationError) as caught:
        backfill(master, [rows])
    assert [(p.location, p.field) for p in caught.value.problems] == [("row 2", "user_id"), ("row 3", "amount")]
    assert _version(master) == done.version


class _Recorder:
    """A BackfillProgress that keeps what it was told."""

    def __init__(self) -> None:
        self.rows_seen = 0
        self.committed_files: list[FileIngested] = []
        self.not_written: list[SourceFile] = []

    def planned(self, files: Any, total_bytes: int) -> None:
        pass

    def rows(self, events: int) -> None:
        self.rows_seen += events

    def committed(self, done: FileIngested) -> None:
        pass

    def failed(self, source: SourceFile, error: Exception, committed: Any, not_written: Any) -> None:
        self.committed_files, self.not_written = list(committed), list(not_written)
