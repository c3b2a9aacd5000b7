"""The progress bar of ``lambda-platform ingest``: files done of total, events, events per second.

On a terminal it is a live bar (stderr); elsewhere each committed file is one line. Either way
every committed file is printed with its version, and a failure lists which files were committed
and which were not, so a re-run can name only the latter.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from types import TracebackType

from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from batch_layer.master.backfill import FileIngested
from batch_layer.master.file_formats import SourceFile
from deploy.terminal import console


class BackfillBar:
    """A ``BackfillProgress`` drawn with rich; use as a context manager around the backfill."""

    def __init__(self) -> None:
        self.events, self.done, self.started = 0, 0, time.monotonic()
        self._progress = Progress(
            TextColumn("[bold]ingest[/] {task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("files"),
            TextColumn("{task.fields[events]:,} events, {task.fields[rate]:,.0f}/s"), TimeElapsedColumn(),
            console=console, transient=True, disable=not console.is_terminal,
        )
        self._task: TaskID | None = None
        self.files: list[SourceFile] = []
        self.committed_files: list[FileIngested] = []
        self.not_written: list[SourceFile] = []

    def __enter__(self) -> BackfillBar:
        self._progress.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self._progress.stop()

    def planned(self, files: Sequence[SourceFile], total_bytes: int) -> None:
        self.files = list(files)
        self._task = self._progress.add_task(self._name(0), total=len(files), events=0, rate=0.0)

    def rows(self, events: int) -> None:
        self.events += events
        if self._task is not None:
            rate = self.events / max(time.monotonic() - self.started, 1e-3)
            self._progress.update(self._task, events=self.events, rate=rate, refresh=True)

    def committed(self, done: FileIngested) -> None:
        if self._task is not None:
            self.done += 1
            self._progress.update(self._task, completed=self.done, description=self._name(self.done), refresh=True)
        if len(self.files) > 1:
            console.print(f"  committed {escape(str(done.source.path))}: {done.events} events at master version "
                          f"{done.version}")

    def _name(self, index: int) -> str:
        return escape(self.files[index].path.name) if index < len(self.files) else ""

    def failed(self, source: SourceFile, error: Exception, committed: Sequence[FileIngested],
               not_written: Sequence[SourceFile]) -> None:
        self.committed_files, self.not_written = list(committed), list(not_written)

    def report_failure(self) -> None:
        """After the error: which files were committed (do not ingest them again) and which were not."""
        committed, rest = self.committed_files, self.not_written
        if not rest:
            return
        if committed:
            console.print(f"[yellow]committed, do not ingest again ({len(committed)}):[/]")
            for done in committed:
                console.print(f"  {escape(str(done.source.path))} (master version {done.version})")
        else:
            console.print("[yellow]nothing was committed[/]")
        console.print(f"[yellow]not written ({len(rest)}):[/]")
        for i, source in enumerate(rest):
            console.print(f"  {escape(str(source.path))}" + (" (failed)" if i == 0 else ""))
