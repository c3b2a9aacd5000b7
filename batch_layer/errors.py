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
