"""Errors raised by the batch layer (master dataset, gold tables, recomputes)."""


class BatchLayerError(Exception):
    """Root of every error raised by batch_layer."""


class StorageError(BatchLayerError):
    """A Delta table could not be read or written; the message names the table."""


class EmptyMasterError(BatchLayerError):
    """The master dataset does not exist yet: ingest events first."""


class IngestError(BatchLayerError):
    """An input file could not be read (missing, unreadable, not JSON Lines)."""


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
