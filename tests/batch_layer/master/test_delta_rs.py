"""delta-rs appends: an application transaction is committed once, whatever retries or a second writer do."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from batch_layer.master import delta_rs
from batch_layer.master.delta_rs import DeltaRsEngine
from batch_layer.master.storage import CommitConflictError

_SCHEMA = pa.schema([("n", pa.int64())])


def _table(tmp_path: Path) -> tuple[DeltaRsEngine, str]:
    engine, path = DeltaRsEngine(), str(tmp_path / "t")
    engine.ensure_table(path, _SCHEMA, name="t", change_feed=False)
    return engine, path


def _rows(path: str) -> list[int]:
    return sorted(r["n"] for r in DeltaTable(path).to_pyarrow_table().to_pylist())


def test_a_recorded_transaction_is_not_committed_again(tmp_path: Path) -> None:
    engine, path = _table(tmp_path)
    engine.append(path, pa.table({"n": [1, 2]}, schema=_SCHEMA), app_transactions=[("ingest:q", 5)])
    with pytest.raises(CommitConflictError, match="already recorded"):
        engine.append(path, pa.table({"n": [1, 2]}, schema=_SCHEMA), app_transactions=[("ingest:q", 5)])
    with pytest.raises(CommitConflictError):
        engine.append(path, pa.table({"n": [9]}, schema=_SCHEMA), app_id="ingest:q", app_version=4)
    engine.append(path, pa.table({"n": [3]}, schema=_SCHEMA), app_transactions=[("ingest:q", 6)])
    assert _rows(path) == [1, 2, 3]


def test_an_io_fault_after_the_commit_landed_is_not_a_second_commit(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The first attempt commits, then its caller sees an OSError (the object store's answer lost): the retry
    finds the transaction recorded and commits nothing; the rows are there once."""
    engine, path = _table(tmp_path)
    real = delta_rs._append
    calls: list[int] = []

    def landed_then_failed(*args: Any, **kwargs: Any) -> int:
        version = real(*args, **kwargs)
        calls.append(version)
        if len(calls) == 1:
            raise OSError("connection reset after the log file was written")
        return version

    monkeypatch.setattr(delta_rs, "_append", landed_then_failed)
    with pytest.raises(CommitConflictError):
        engine.append(path, pa.table({"n": [1, 2]}, schema=_SCHEMA), app_transactions=[("ingest:q", 0)])
    assert _rows(path) == [1, 2] and len(calls) == 1


def test_a_stream_is_sent_once_never_retried_half_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    engine, path = _table(tmp_path)

    def fails(*args: Any, **kwargs: Any) -> int:
        raise OSError("transient")

    monkeypatch.setattr(delta_rs, "_append", fails)
    stream = pa.table({"n": [1]}, schema=_SCHEMA).to_reader()
    with pytest.raises(OSError):
        engine.append(path, stream, app_transactions=[("ingest:q", 0)])
    assert _rows(path) == []
