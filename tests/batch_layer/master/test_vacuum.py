"""Vacuum keeps every version from the one to keep readable, and deletes what only older versions read.

A plain Delta table (delta-rs) gets one row per commit, is compacted (OPTIMIZE removes those files
from the newest snapshot), and vacuumed. Oracle: version v holds the rows appended through v,
counted here. The retention is checked with a fake clock against the commits' own timestamps.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import DeltaError

from batch_layer.master.delta_log import read_commit
from batch_layer.master.vacuum import MARGIN_SECONDS, retention_hours, vacuum_table


def parquet_files(table: Path) -> set[str]:
    return {p.name for p in table.glob("*.parquet")}


def rows(table: Path, version: int | None = None) -> list[int]:
    return sorted(DeltaTable(str(table), version=version).to_pyarrow_table()["x"].to_pylist())


def test_vacuum_keeps_every_version_from_keep_from_and_deletes_the_rest(tmp_path: Path) -> None:
    table = tmp_path / "t"
    for i in range(6):  # versions 0..5, one row each
        write_deltalake(str(table), pa.table({"x": [i]}), mode="append")
    small = parquet_files(table)
    DeltaTable(str(table)).optimize.compact()  # version 6: removes the six small files
    write_deltalake(str(table), pa.table({"x": [6]}), mode="append")  # version 7
    assert not read_commit(str(table), 6).changes_data and read_commit(str(table), 7).changes_data

    kept = vacuum_table(str(table), 5, floor_hours=0, what="a test table")
    assert kept.files_deleted == 0 and kept.retention_hours >= 1, "version 5 reads the small files"
    assert rows(table, 5) == list(range(6)) and rows(table) == list(range(7))
    assert DeltaTable(str(table)).version() == 7, "a VACUUM that deletes nothing commits nothing"

    done = vacuum_table(str(table), 7, floor_hours=0, what="a test table")
    assert done.files_deleted == len(small) and not parquet_files(table) & small
    assert DeltaTable(str(table)).version() == 9, "VACUUM START and END"
    assert not any(read_commit(str(table), v).changes_data for v in (8, 9)), "vacuum commits change no data"
    assert rows(table) == list(range(7)) and rows(table, 7) == list(range(7))
    with pytest.raises((DeltaError, OSError)):
        rows(table, 5)


def test_retention_reaches_back_to_the_commit_after_keep_from(tmp_path: Path) -> None:
    table = tmp_path / "t"
    for i in range(4):
        write_deltalake(str(table), pa.table({"x": [i]}), mode="append")
    after = read_commit(str(table), 2).timestamp
    assert after is not None
    five_hours_later = after + 5 * 3600
    assert retention_hours(str(table), 1, floor_hours=0, now=five_hours_later) == 6  # 5 h + the margin, rounded up
    assert retention_hours(str(table), 1, floor_hours=168, now=five_hours_later) == 168
    assert retention_hours(str(table), 3, floor_hours=2.5, now=five_hours_later) == 3, "nothing after it: the floor"
    assert MARGIN_SECONDS < 3600
