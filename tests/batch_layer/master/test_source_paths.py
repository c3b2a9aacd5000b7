"""Every problem of the paths given to ingest, reported at once, before anything is written.

`lambda-platform ingest nope.csv foo.txt` used to name only nope.csv; fixing it and running again
then showed foo.txt. Now one SourceFilesError (an IngestError) names each path with its problem,
the paths' problems in the order given and then the files' structure problems (CSV headers, Parquet
schemas), and the master dataset is not touched. No Spark: the delta-rs engine and plain files.

Oracle: the test's own record of what it made wrong in each path (missing, extension, empty folder,
header column), not the code's reading of the files; "nothing written" is the absence of a Delta
log, read from the filesystem.
"""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batch_layer.errors import IngestError, SourceFilesError
from batch_layer.master.backfill import backfill
from batch_layer.master.dataset import MasterDataset
from batch_layer.master.engines import get_engine
from batch_layer.master.file_formats import source_files
from deploy.cli.exits import EXIT_FAILED
from deploy.cli.main import run
from shared_logic import EventValidationError, load_pipeline

HEADER = "user_id,merchant,amount,event_time\n"
GOOD_ROW = "u1,m1,12.5,2026-01-01T00:00:00Z\n"
EXTENSIONS = ".parquet, .csv, .jsonl, .json"


@pytest.fixture
def master(tmp_path: Path) -> MasterDataset:
    return MasterDataset(tmp_path / "master", load_pipeline("payments"), get_engine("delta-rs"))


def _written(master: MasterDataset) -> bool:
    return (master.path / "_delta_log").exists()


def _lines(error: Exception) -> list[str]:
    """The message's lines after the first: one per problem."""
    return [line.strip() for line in str(error).splitlines()[1:]]


def test_every_missing_path_unknown_extension_and_empty_folder_is_named_at_once(tmp_path: Path) -> None:
    nope, foo, empty, good = tmp_path / "nope.csv", tmp_path / "foo.txt", tmp_path / "empty", tmp_path / "good.csv"
    foo.write_text("not events")
    empty.mkdir()
    (empty / "_SUCCESS").write_text("")  # skipped: the folder still holds no event file
    good.write_text(HEADER + GOOD_ROW)
    no_suffix = tmp_path / "README"
    no_suffix.write_text("x")

    with pytest.raises(SourceFilesError) as caught:
        source_files([nope, good, foo, empty, no_suffix])

    error = caught.value
    assert isinstance(error, IngestError)  # what callers already catch
    assert [path for path, _ in error.problems] == [str(nope), str(foo), str(empty), str(no_suffix)]  # order given
    assert _lines(error) == [
        f"{nope}: no such file",
        f"{foo}: unknown extension '.txt'; the accepted extensions are {EXTENSIONS} (or name the format)",
        f"{empty}: the folder holds no {EXTENSIONS} files",
        f"{no_suffix}: unknown extension '(none)'; the accepted extensions are {EXTENSIONS} (or name the format)",
    ]
    assert str(good) not in str(error)
    assert str(error).splitlines()[0] == "cannot ingest: 4 problems in 4 paths; nothing was written:"


def test_one_bad_path_keeps_its_one_line_message(tmp_path: Path) -> None:
    with pytest.raises(SourceFilesError, match=r"^cannot ingest .*missing\.jsonl: no such file$"):
        source_files([tmp_path / "missing.jsonl"])
    text = tmp_path / "events.txt"
    text.write_text(HEADER + GOOD_ROW)
    [source] = source_files([text], "csv")  # a named format takes any extension
    assert source.format == "csv" and source.path == text


def test_backfill_names_every_path_and_header_problem_and_writes_nothing(master: MasterDataset, tmp_path: Path) -> None:
    good = tmp_path / "1-good.csv"
    good.write_text(HEADER + GOOD_ROW)
    missing = tmp_path / "2-missing.csv"
    header = tmp_path / "3-header.csv"
    header.write_text("user_id,amount,colour\nu1,1,red\n")  # 'colour' is no field; 'merchant' has no column
    notes = tmp_path / "4-notes.txt"
    notes.write_text("x")
    typed = tmp_path / "5-typed.parquet"
    pq.write_table(pa.table({"user_id": ["u"], "merchant": ["m"], "amount": ["1.5"]}), typed)  # amount as text

    with pytest.raises(SourceFilesError) as caught:
        backfill(master, [good, missing, header, notes, typed])

    problems = caught.value.problems
    assert [path for path, _ in problems] == [str(missing), str(notes), str(header), str(header), str(typed)]
    by_path = {path: [why for p, why in problems if p == path] for path, _ in problems}
    assert by_path[str(missing)] == ["no such file"]
    assert by_path[str(notes)][0].startswith("unknown extension '.txt'")
    assert sorted(by_path[str(header)]) == [
        "line 1, field 'colour': unknown column: not a field of the event model",
        "line 1, field 'merchant': required field has no column",
    ]
    [typed_problem] = by_path[str(typed)]
    assert typed_problem.startswith("schema, field 'amount'")
    assert str(good) not in str(caught.value)
    assert not _written(master)  # the good file first in line is not written either


def test_several_bad_headers_are_all_named(master: MasterDataset, tmp_path: Path) -> None:
    first, second = tmp_path / "a.csv", tmp_path / "b.csv"
    first.write_text("user_id,merchant,amount,tip\nu,m,1,2\n")
    second.write_text("user_id,merchant\nu,m\n")
    binary = tmp_path / "c.csv"
    binary.write_bytes(b"user_id,merch\xff\xfeant,amount\n")  # not UTF-8: named, not a traceback

    with pytest.raises(SourceFilesError) as caught:
        backfill(master, [tmp_path])

    assert _lines(caught.value) == [
        f"{first}: line 1, field 'tip': unknown column: not a field of the event model",
        f"{second}: line 1, field 'amount': required field has no column",
        f"{binary}: not UTF-8 text (invalid start byte at byte 13)",
    ]
    assert not _written(master)


def test_one_file_with_a_bad_header_still_raises_its_own_error(master: MasterDataset, tmp_path: Path) -> None:
    good, header = tmp_path / "good.csv", tmp_path / "header.csv"
    good.write_text(HEADER + GOOD_ROW)
    header.write_text("user_id,merchant,amount,colour\nu,m,1,red\n")
    with pytest.raises(EventValidationError) as caught:
        backfill(master, [good, header])
    assert [(p.location, p.field) for p in caught.value.problems] == [("line 1", "colour")]
    binary = tmp_path / "binary.csv"
    binary.write_bytes(b"\xff\xfe")
    with pytest.raises(IngestError, match=r"binary\.csv: not UTF-8 text"):
        backfill(master, [good, binary])
    assert not _written(master)


def test_the_command_line_names_every_bad_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's own example, `lambda-platform ingest nope.csv foo.txt`, from the folder holding them."""
    for name in [n for n in os.environ if n.startswith("LAMBDA_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("LAMBDA_STORAGE_ENGINE", "delta-rs")
    monkeypatch.chdir(tmp_path)
    Path("foo.txt").write_text("hello\n")

    status = run(["--data-dir", "data", "--pipeline", "payments", "ingest", "nope.csv", "foo.txt"])

    said = " ".join(capsys.readouterr().err.split())  # rich wraps long lines
    assert status == EXIT_FAILED
    assert "nope.csv: no such file" in said and "foo.txt: unknown extension '.txt'" in said, said
    assert "nothing was written" in said and "Traceback" not in said
    assert not (tmp_path / "data" / "master" / "payments" / "_delta_log").exists()
