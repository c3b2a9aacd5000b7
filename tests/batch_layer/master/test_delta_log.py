"""The Delta-log reader on real tables written by delta-rs, with every character that
``str.splitlines()`` takes for a line end in event texts (so in the column statistics), in
application-transaction ids and in commit metadata.

Oracles: what the test wrote (ids, app versions, metadata, row counts), the wall clock around each
commit, and delta-rs' own reading of the log (``DeltaTable.history``) for commit timestamps.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import DeltaError

from batch_layer.master.dataset import MasterDataset
from batch_layer.master.delta_log import (
    DeltaLogError,
    LogHead,
    LogTrim,
    commit_path,
    newest_version,
    parse_actions,
    read_commit,
    trim_log,
)
from batch_layer.master.engines import get_engine
from batch_layer.master.storage import Appender
from shared_logic import load_pipeline

#: Everything Python's str.splitlines() splits on besides "\n". delta-rs escapes the control
#: characters in JSON and writes U+0085, U+2028 and U+2029 as they are.
SEPARATORS = ["\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029", "\r"]
IDS = [f"U+{ord(s):04X}" for s in SEPARATORS]


@pytest.fixture
def master(tmp_path: Path) -> MasterDataset:
    master = MasterDataset(tmp_path / "master", load_pipeline("wordcount"), get_engine("delta-rs"))
    master.ensure()
    return master


def texts(master: MasterDataset, *values: str) -> pa.Table:
    return master.pipeline.schema.validate([{"text": v, "event_time": "2026-01-01T00:00:00Z"} for v in values])


def commit_times(path: Path) -> dict[int, float]:
    """Commit timestamps (epoch seconds) as delta-rs reads them from the log."""
    return {h["version"]: h["timestamp"] / 1000 for h in DeltaTable(str(path)).history()}


@pytest.mark.parametrize("sep", SEPARATORS, ids=IDS)
def test_txns_commit_info_rows_and_time_are_read_whatever_separator_they_hold(master: MasterDataset, sep: str) -> None:
    appender = master.appender()
    app_id, plain = f"app{sep}id", "plain-id"
    metadata = {"note": f"x{sep}y", f"key{sep}": "v", "lambda.keys": f'{{"{sep}":1}}'}
    rows = [f"a{sep}b", sep, f"z{sep}", f"{sep}{sep}" * 20]  # inside, the minimum, the maximum, long
    expected = appender.version() + 1  # as ingest does: app version = lower bound of the commit version
    before = time.time()
    version = appender.append(texts(master, *rows), app_transactions=[(app_id, expected), (plain, expected)],
                              metadata=metadata)
    after = time.time()
    later = appender.append(texts(master, f"later{sep}"), app_transactions=[(f"later{sep}", version + 1)])

    commit = read_commit(master.path, version)
    assert commit is not None and commit.version == version
    assert commit.app_transactions == {app_id: expected, plain: expected}
    assert commit.records_transaction(app_id) and not commit.records_transaction(f"later{sep}")
    assert {k: commit.info[k] for k in metadata} == metadata
    assert commit.rows_added == len(rows)
    assert commit.timestamp == commit_times(master.path)[version]
    assert before - 0.001 <= commit.timestamp <= after + 0.001  # recorded in whole milliseconds

    later_commit = read_commit(master.path, later)
    assert later_commit is not None and later_commit.rows_added == 1
    assert later_commit.app_transactions == {f"later{sep}": version + 1}

    # the engine finds each transaction's commit through the reader, also from a fresh appender
    for writer in (appender, master.appender()):
        for wanted, at in ((app_id, version), (plain, version), (f"later{sep}", later)):
            found = writer.find_transaction(wanted)
            assert found is not None and (found.app_id, found.version) == (wanted, at)
            assert dict(found.commit_info) == dict(read_commit(master.path, at).info)
        assert dict(writer.find_transaction(app_id).commit_info)["note"] == f"x{sep}y"
        assert writer.find_transaction(f"other{sep}") is None


def test_every_separator_in_one_commit(master: MasterDataset) -> None:
    appender: Appender = master.appender()
    every = "".join(SEPARATORS)
    ids = [f"{i}{sep}" for i, sep in enumerate(SEPARATORS)]
    version = appender.append(texts(master, every, *SEPARATORS), app_transactions=[(i, 1) for i in ids],
                              metadata={every: every})
    commit = read_commit(master.path, version)
    assert commit is not None
    assert commit.app_transactions == dict.fromkeys(ids, 1)
    assert commit.info[every] == every
    assert commit.rows_added == 1 + len(SEPARATORS)
    assert [appender.find_transaction(i, from_version=0).version for i in ids] == [version] * len(ids)


def test_crlf_line_ends_and_blank_lines_are_tolerated(master: MasterDataset, tmp_path: Path) -> None:
    version = master.append(texts(master, "a\u2028b", "c\x85"), app_id="crlf", app_version=1, metadata={"m": "\u2029"})
    original = commit_path(master.path, version).read_bytes()
    assert original.count(b"\n") >= 2
    copy = tmp_path / "copy"
    shutil.copytree(master.path / "_delta_log", copy / "_delta_log")
    commit_path(copy, version).write_bytes(b"\r\n" + original.replace(b"\n", b"\r\n\r\n") + b"\n \n")

    assert parse_actions(commit_path(copy, version).read_bytes()) == parse_actions(original)
    commit, expected = read_commit(copy, version), read_commit(master.path, version)
    assert commit is not None and expected is not None
    assert commit == expected
    assert (commit.app_transactions, commit.info["m"], commit.rows_added) == ({"crlf": 1}, "\u2029", 2)


def test_a_damaged_commit_file_names_the_file_and_line(master: MasterDataset) -> None:
    version = master.append(texts(master, "x"))
    path = commit_path(master.path, version)
    lines = path.read_bytes().split(b"\n")
    path.write_bytes(b"\n".join([lines[0], lines[1][: len(lines[1]) // 2], *lines[2:]]))
    with pytest.raises(DeltaLogError, match=rf"{path.name}, line 2: not a JSON action"):
        read_commit(master.path, version)
    path.write_bytes(lines[0] + b"\n[1, 2]\n")
    with pytest.raises(DeltaLogError, match="line 2: a Delta action must be a JSON object"):
        read_commit(master.path, version)


def test_a_compaction_commit_adds_no_rows(master: MasterDataset) -> None:
    for text in ("a\x85", "b\u2028", "c\u2029"):
        master.append(texts(master, text, text))
    DeltaTable(str(master.path)).optimize.compact()  # dataChange = false
    compaction = newest_version(master.path)
    assert compaction == 4
    commit = read_commit(master.path, compaction)
    assert commit is not None and commit.rows_added == 0
    assert commit.info["operation"] == "OPTIMIZE"
    assert [read_commit(master.path, v).rows_added for v in range(1, 4)] == [2, 2, 2]


def test_newest_version_and_missing_commits(tmp_path: Path, master: MasterDataset) -> None:
    assert newest_version(tmp_path / "nothing") is None
    assert LogHead(tmp_path / "nothing").version() is None
    assert read_commit(tmp_path / "nothing", 0) is None
    head = LogHead(master.path)
    assert head.version() == newest_version(master.path) == 0
    master.append(texts(master, "\u2028"))
    assert head.version(refresh=False) == 0  # as of its last look
    assert head.version() == newest_version(master.path) == 1
    assert read_commit(master.path, 2) is None


@pytest.mark.slow  # over 10 s: the end-to-end tier
def test_trimming_the_log_keeps_every_version_from_the_one_to_keep(tmp_path: Path, spark: Any) -> None:
    """Commits before the newest checkpoint at or below ``keep_from`` go; every version from ``keep_from``
    on reads the same rows (delta-rs and delta-spark, which is also how the speed layer's source reads),
    a new commit lands after it, and a version before that checkpoint can no longer be loaded.
    Oracle: version v of the table holds the rows 0..v, one appended per commit."""
    table = str(tmp_path / "t")
    for i in range(25):  # a checkpoint every 10 commits (delta-rs writes them after versions 9 and 19)
        write_deltalake(table, pa.table({"x": [i]}), mode="append", configuration={"delta.checkpointInterval": "10"})
    log = tmp_path / "t" / "_delta_log"
    assert trim_log(table, 5) == LogTrim(None, 0), "no checkpoint at or below version 5: nothing may go"

    trimmed = trim_log(table, 15)
    assert trimmed.starts_at == 9 and trimmed.deleted == 9
    assert sorted(p.name for p in log.glob("*.json"))[0] == f"{9:020d}.json"
    for version in range(15, 25):
        assert sorted(DeltaTable(table, version=version).to_pyarrow_table()["x"].to_pylist()) == list(range(version + 1))
    assert spark.read.format("delta").option("versionAsOf", 15).load(table).count() == 16
    assert spark.read.format("delta").load(table).count() == 25
    write_deltalake(table, pa.table({"x": [25]}), mode="append")
    assert sorted(DeltaTable(table).to_pyarrow_table()["x"].to_pylist()) == list(range(26))
    with pytest.raises(DeltaError):
        DeltaTable(table, version=5)
    assert trim_log(table, 15) == LogTrim(9, 0), "trimming again deletes nothing more"
