"""Bulk backfill: many event files (JSON Lines, CSV, Parquet; folders) into the master dataset.

Guarantees:

* Every file is one master commit, all of it or none of it (``MasterDataset.ingest_file``), so the
  speed layer and a recompute see a backfilled file like any other commit. Files are committed in
  the order given (a folder's files sorted by name).
* Before anything is written, every path is resolved and every file's structure is checked: CSV
  headers and Parquet schemas, which cost a line or a footer each. Every problem found so is reported
  at once: one file's structure problem as that file's error (EventValidationError, IngestError), any
  other set of problems (a missing path, a folder without event files, an unknown extension, several
  files' structure) as one SourceFilesError naming each path and its problem. Rows are validated
  file by file just before that file's commit: checking every row of every file first would read all
  the data twice.
* When a file fails, the files before it stay committed: the error raised is the file's own
  (EventValidationError, IngestError), and ``progress.failed`` is told which files were committed
  (with their versions) and which were not, so a re-run can name only the files not written.
* With dead letters (``backfill(..., dead_letters=...)``) a bad line or row no longer stops its file:
  each file's valid records are committed and its bad ones kept as dead letters (see
  ``MasterDataset.ingest_file``), with source 'file' when ``paths`` is one file, else 'backfill'.
  Problems of a file's structure still stop the backfill as above.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from batch_layer.errors import IngestError, SourceFilesError
from batch_layer.master.file_formats import SourceFile, check, resolve_sources
from shared_logic.errors import EventValidationError
from shared_logic.events import EventSchema

if TYPE_CHECKING:
    from batch_layer.master.dataset import IngestResult, MasterDataset
    from batch_layer.master.dead_letters import DeadLetters


@dataclass(frozen=True)
class FileIngested:
    """One committed file: its events, at master ``version``."""

    source: SourceFile
    events: int
    version: int
    #: Its bad lines or rows kept as dead letters (a backfill with dead letters; else 0).
    dead_letters: int = 0


class BackfillProgress(Protocol):
    """What a backfill reports while it works (the CLI draws a progress bar from it)."""

    def planned(self, files: Sequence[SourceFile], total_bytes: int) -> None:
        """The files to ingest, in order, checked; nothing written yet."""

    def rows(self, events: int) -> None:
        """``events`` more events validated of the current file."""

    def committed(self, done: FileIngested) -> None:
        """A file was committed."""

    def failed(self, source: SourceFile, error: Exception, committed: Sequence[FileIngested],
               not_written: Sequence[SourceFile]) -> None:
        """``source`` failed with ``error`` (raised next); ``committed`` stay, ``not_written`` (it included) were not."""


def backfill(master: MasterDataset, paths: Sequence[Path], *, file_format: str | None = None,
             progress: BackfillProgress | None = None, dead_letters: DeadLetters | None = None) -> list[FileIngested]:
    """Ingest the files ``paths`` name, one commit per file, in order (see the module docstring)."""
    files = checked_files(paths, master.pipeline.schema, file_format)
    letter_source = "file" if len(paths) == 1 and paths[0].is_file() else "backfill"
    if progress is not None:
        progress.planned(files, sum(s.path.stat().st_size for s in files))
    done: list[FileIngested] = []
    for i, source in enumerate(files):
        try:
            result: IngestResult = master.ingest_file(source, on_rows=progress.rows if progress else None,
                                                      dead_letters=dead_letters, letter_source=letter_source)
        except Exception as e:
            if progress is not None:
                progress.failed(source, e, list(done), files[i:])
            raise
        done.append(FileIngested(source, result.events, result.version, result.dead_letters))
        if progress is not None:
            progress.committed(done[-1])
    return done


def checked_files(paths: Sequence[Path], schema: EventSchema, file_format: str | None = None) -> list[SourceFile]:
    """The files ``paths`` name, each checked against ``schema`` as far as is cheap (header, footer).

    Every path and every file is looked at before this raises: the problems of the paths (in the
    order given), then those of the files' structure (in file order), in one SourceFilesError, unless
    the only problem is one file's structure: then that file's own error (EventValidationError naming
    line 1 or ``schema`` and each field, or IngestError).
    """
    files, problems = resolve_sources(paths, file_format)
    unresolved = len(problems)
    failed: list[Exception] = []
    for source in files:
        try:
            check(source, schema)
        except EventValidationError as e:
            failed.append(e)
            problems += [(str(source.path), str(p)) for p in e.problems]
        except IngestError as e:
            failed.append(e)
            problems.append((str(source.path), str(e).removeprefix(f"cannot ingest {source.path}: ")))
    if not unresolved and len(failed) == 1:
        raise failed[0]
    if problems:
        raise SourceFilesError(problems)
    return files
