"""Bulk backfill: many event files (JSON Lines, CSV, Parquet; folders) into the master dataset.

Guarantees:

* Every file is one master commit, all of it or none of it (``MasterDataset.ingest_file``), so the
  speed layer and a recompute see a backfilled file like any other commit. Files are committed in
  the order given (a folder's files sorted by name).
* Before anything is written, every path is resolved (a missing path or an unknown extension is an
  IngestError) and every file's structure is checked: CSV headers and Parquet schemas, which cost a
  line or a footer each. Rows are validated file by file just before that file's commit: checking
  every row of every file first would read all the data twice.
* When a file fails, the files before it stay committed: the error raised is the file's own
  (EventValidationError, IngestError), and ``progress.failed`` is told which files were committed
  (with their versions) and which were not, so a re-run can name only the files not written.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from batch_layer.master.file_formats import SourceFile, check, source_files

if TYPE_CHECKING:
    from batch_layer.master.dataset import IngestResult, MasterDataset


@dataclass(frozen=True)
class FileIngested:
    """One committed file: its events, at master ``version``."""

    source: SourceFile
    events: int
    version: int


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
             progress: BackfillProgress | None = None) -> list[FileIngested]:
    """Ingest the files ``paths`` name, one commit per file, in order (see the module docstring)."""
    files = source_files(paths, file_format)
    for source in files:
        check(source, master.pipeline.schema)
    if progress is not None:
        progress.planned(files, sum(s.path.stat().st_size for s in files))
    done: list[FileIngested] = []
    for i, source in enumerate(files):
        try:
            result: IngestResult = master.ingest_file(source, on_rows=progress.rows if progress else None)
        except Exception as e:
            if progress is not None:
                progress.failed(source, e, list(done), files[i:])
            raise
        done.append(FileIngested(source, result.events, result.version))
        if progress is not None:
            progress.committed(done[-1])
    return done
