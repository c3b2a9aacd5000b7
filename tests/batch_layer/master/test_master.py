"""The master dataset: append-only, every commit a version; a bad file writes nothing.

The oracle for "nothing written" is the Delta log itself (version and row count, read with
delta-rs), not the code under test.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from deltalake import DeltaTable

from batch_layer.errors import IngestError
from batch_layer.master import dataset as master_module
from batch_layer.master.dataset import MasterDataset
from batch_layer.master.engines import get_engine
from shared_logic import EventValidationError, load_pipeline


@pytest.fixture
def master(tmp_path: Path) -> MasterDataset:
    return MasterDataset(tmp_path / "master", load_pipeline("payments"), get_engine("delta-rs"))


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def _good(i: int) -> str:
    return json.dumps({"user_id": f"u{i}", "merchant": "m", "amount": i, "event_time": "2026-01-01T00:00:00Z"})


def test_ingest_appends_one_version_with_every_event(master: MasterDataset, tmp_path: Path) -> None:
    first = master.ingest_file(_write(tmp_path / "a.jsonl", [_good(i) for i in range(10)]))
    second = master.ingest_file(_write(tmp_path / "b.jsonl", [_good(i) for i in range(5)]))
    assert (first.events, second.events) == (10, 5)
    assert second.version == first.version + 1
    table = DeltaTable(str(master.path))
    assert table.version() == second.version
    assert table.to_pyarrow_table().num_rows == 15
    assert DeltaTable(str(master.path), version=first.version).to_pyarrow_table().num_rows == 10
    assert table.metadata().configuration.get("delta.enableChangeDataFeed") == "true"


def test_bad_line_anywhere_writes_nothing(master: MasterDataset, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    master.ingest_file(_write(tmp_path / "ok.jsonl", [_good(1)]))
    before = DeltaTable(str(master.path)).version()
    monkeypatch.setattr(master_module, "INGEST_CHUNK_LINES", 3)  # the bad line lands in a late chunk
    lines = [_good(i) for i in range(10)]
    lines[7] = json.dumps({"user_id": "u", "merchant": "m", "amount": "lots"})
    lines.append("")  # blank lines are skipped, and still counted for line numbers
    lines.append('{"user_id": 5, "merchant": "m", "amount": 1}')
    with pytest.raises(EventValidationError) as info:
        master.ingest_file(_write(tmp_path / "bad.jsonl", lines))
    assert [(p.location, p.field) for p in info.value.problems] == [("line 8", "amount"), ("line 12", "user_id")]
    table = DeltaTable(str(master.path))
    assert table.version() == before
    assert table.to_pyarrow_table().num_rows == 1


def test_unreadable_files_are_reported(master: MasterDataset, tmp_path: Path) -> None:
    with pytest.raises(IngestError, match="no such file"):
        master.ingest_file(tmp_path / "missing.jsonl")
    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(b'{"user_id": "u"}\n\xff\xfe\x00')
    with pytest.raises(IngestError, match="not UTF-8"):
        master.ingest_file(binary)


def test_barrier_rows_never_reach_the_snapshot(spark, master: MasterDataset, tmp_path: Path) -> None:
    master.ingest_file(_write(tmp_path / "a.jsonl", [_good(i) for i in range(4)]))
    version = master.append_barrier("test-run")
    master.ingest_file(_write(tmp_path / "b.jsonl", [_good(9)]))
    snapshot = master.snapshot(spark, version)
    assert sorted(r.user_id for r in snapshot.collect()) == ["u0", "u1", "u2", "u3"]
    assert "_kind" not in snapshot.columns
