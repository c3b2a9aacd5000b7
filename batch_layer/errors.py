"""Errors raised by the batch layer (master dataset, gold tables, recomputes)."""

from __future__ import annotations

from collections.abc import Sequence


class BatchLayerError(Exception):
    """Root of every error raised by batch_layer."""


class StorageError(BatchLayerError):
    """A Delta table could not be read or written; the message names the table."""


class EmptyMasterError(BatchLayerError):
    """The master dataset does not exist yet: ingest events first."""


class IngestError(BatchLayerError):
    """An input file could not be read (missing, unreadable, not JSON Lines)."""


class SourceFilesError(IngestError):
    """Paths given to ``ingest`` that cannot be ingested, every one found before anything was written:
    a missing path, a folder with no event files, an unknown extension, and (from a backfill) each CSV
    header or Parquet schema that does not fit the event model. ``problems`` holds (path, what is
    wrong) pairs, the paths' own problems first in the order given, then the files' structure; the
    message names each path and its problem, one a line."""

    def __init__(self, problems: Sequence[tuple[str, str]]) -> None:
        self.problems = tuple(problems)
        self.paths = tuple(dict.fromkeys(path for path, _ in self.problems))
        if len(self.problems) == 1:
            [(path, why)] = self.problems
            super().__init__(f"cannot ingest {path}: {why}")
        else:
            shown = "\n  ".join(f"{path}: {why}" for path, why in self.problems)
            super().__init__(f"cannot ingest: {len(self.problems)} problems in {len(self.paths)} paths; nothing was "
                             f"written:\n  {shown}")


class PublishError(BatchLayerError):
    """A generation could not be published to the serving store."""


class RunInProgressError(BatchLayerError):
    """Another process is recomputing this data dir (the single-flight lock is held), or a run is queued."""


class SchemaChangeError(BatchLayerError):
    """The pipeline's event model changed in a way the existing master dataset cannot follow (a field
    removed or retyped, or a required field added to a table holding rows). Raised before anything is
    written; ``fields`` names the fields, the message says for each what to do."""

    def __init__(self, table: str, problems: dict[str, str]) -> None:
        self.table, self.problems = table, dict(problems)
        self.fields = tuple(self.problems)
        shown = "\n  ".join(f"field {name!r}: {why}" for name, why in self.problems.items())
        super().__init__(
            f"the event model does not fit the master dataset at {table}; nothing was written:\n  {shown}"
        )


class EventIdIndexError(StorageError):
    """The event-id index cannot be brought to the run's barrier without changing answers already served."""
