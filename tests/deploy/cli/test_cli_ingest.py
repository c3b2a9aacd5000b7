"""`lambda-platform ingest FILE...` in process: several files and a folder, and a failure that says
which files were committed and which were not.

Oracle: the number of rows the test wrote into each file, and the Delta log read with delta-rs.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from deltalake import DeltaTable

from deploy.cli.exits import EXIT_FAILED, EXIT_OK
from deploy.cli.main import run

HEADER = "user_id,merchant,amount,event_time\n"


def _csv(path: Path, rows: int, bad_line: int | None = None) -> Path:
    lines = [f"u{i},m{i},{i}.5,2026-01-01T00:00:00Z\n" for i in range(rows)]
    if bad_line is not None:
        lines[bad_line - 2] = "u,m,lots,2026-01-01T00:00:00Z\n"  # the header is line 1
    path.write_text(HEADER + "".join(lines), encoding="utf-8")
    return path


def test_ingest_files_and_folders_then_a_failure_lists_what_was_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    for name in [n for n in os.environ if n.startswith("LAMBDA_")]:
        monkeypatch.delenv(name)
    data = tmp_path / "data"
    monkeypatch.setenv("LAMBDA_STORAGE_ENGINE", "delta-rs")
    folder = tmp_path / "day"
    folder.mkdir()
    _csv(folder / "b.csv", 3)
    _csv(folder / "a.csv", 2)
    single = _csv(tmp_path / "one.csv", 4)
    common = ["--data-dir", str(data), "--pipeline", "payments", "ingest"]

    assert run([*common, str(single), str(folder)]) == EXIT_OK
    said = capsys.readouterr().err
    assert "ingested 9 events" in said and "from 3 files" in said
    master = data / "master" / "payments"
    table = DeltaTable(str(master))
    versions = [table.version() - 2, table.version() - 1, table.version()]
    rows = [DeltaTable(str(master), version=v).to_pyarrow_table().num_rows for v in versions]
    assert rows == [4, 4 + 2, 4 + 2 + 3]  # one.csv, then the folder's a.csv and b.csv, a version each

    bad = _csv(tmp_path / "bad.csv", 5, bad_line=4)
    after = _csv(tmp_path / "after.csv", 1)
    first = _csv(tmp_path / "first.csv", 1)
    assert run([*common, str(first), str(bad), str(after)]) == EXIT_FAILED
    said = capsys.readouterr().err
    assert "line 4, field 'amount'" in said and str(bad) in said
    assert "do not ingest again" in said and str(first) in said
    written, not_written = said.split("not written")
    assert str(first) in written and str(bad) in not_written and str(after) in not_written
    assert DeltaTable(str(master)).version() == versions[-1] + 1  # first.csv only

    assert run([*common, "--format", "csv", str(tmp_path / "nowhere.csv")]) == EXIT_FAILED
    assert "no such file" in capsys.readouterr().err
