"""The storage engine interface: how the layers read and write Delta tables.

The layers never call a Delta library directly; they go through a :class:`StorageEngine`, so the
JVM engine (delta-spark, for clusters) stands beside the embedded delta-rs engine. Engines are
registered by name in :func:`get_engine`. An engine whose Delta runs inside Spark also implements
:class:`SparkStorage` (Spark writes the tables itself); for an engine that does not, the callers
keep their delta-rs way (gold: Spark writes parquet, delta-rs commits the files; the speed layer:
a Python streaming source over the log) and :func:`compact` uses delta-rs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import pyarrow as pa

from batch_layer.errors import StorageError
from batch_layer.master.object_store import Location

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from shared_logic.events import EventSchema


class CommitConflictError(StorageError):
    """A commit lost a race it cannot be retried through: another writer committed a conflicting
    transaction first (e.g. the same application transaction id). Nothing of this commit landed;
    refresh the table state and decide again."""


@dataclass(frozen=True)
class CommittedTransaction:
    """Where an application transaction was committed, found again from the Delta log."""

    app_id: str
    #: The app version recorded with it (``DeltaTable.transaction_version``).
    app_version: int
    #: The table version of the commit holding it; None when its commit file is no longer in the
    #: log (cleaned up after ``delta.logRetentionDuration``, 30 days by default).
    version: int | None
    #: That commit's ``commitInfo``, custom metadata included (empty when ``version`` is None).
    commit_info: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TableState:
    """An existing table as its newest version describes it: that version, its columns (in the table's
    order), and how many data files it holds (0: no rows)."""

    version: int
    schema: pa.Schema
    files: int


@dataclass(frozen=True)
class CompactionResult:
    """What a compaction did: the version of its commit (None: nothing to compact), files removed and added."""

    version: int | None
    files_removed: int
    files_added: int


class Appender(Protocol):
    """A long-lived writer for one table that keeps the table's state between commits.

    For a stream of small commits (HTTP ingest): the log is not reloaded for every commit, only
    the commits other writers made since are read. Not thread-safe: one caller at a time.
    """

    def version(self) -> int:
        """The table version this appender's state is at (after its own last commit: that commit)."""

    def refresh(self) -> None:
        """Read the commits other writers made since (call after a CommitConflictError)."""

    def transaction_version(self, app_id: str) -> int | None:
        """The app version recorded for ``app_id`` as of ``version()``, or None."""

    def append(self, data: pa.Table | pa.RecordBatchReader, *, app_transactions: Sequence[tuple[str, int]] = (),
               metadata: Mapping[str, str] | None = None) -> int:
        """Append ``data`` in one commit recording every (app_id, app_version); returns its version.

        Raises CommitConflictError when a concurrent commit recorded one of the same app ids.
        """

    def find_transaction(self, app_id: str, *, from_version: int | None = None) -> CommittedTransaction | None:
        """The commit that recorded ``app_id`` (None if none did), found by reading commit files
        from ``from_version`` on; by default from the recorded app version, for writers that
        record a lower bound of the commit's version as app version (as HTTP ingest does).
        """


class StorageEngine(Protocol):
    """Delta Lake operations the platform needs. Every write is one atomic Delta commit."""

    def ensure_table(self, path: Location, schema: pa.Schema, *, name: str, change_feed: bool) -> None:
        """Create the table if it does not exist (safe when several processes race to create it)."""

    def latest_version(self, path: Location) -> int | None:
        """The newest committed version, or None when there is no table at ``path``."""

    def table_state(self, path: Location) -> TableState | None:
        """The table's newest version, columns and file count (read from its log), or None when there is none."""

    def add_columns(self, path: Location, fields: Sequence[pa.Field], *, metadata: Mapping[str, str]) -> int:
        """Add nullable columns ``fields`` (at the end) in one commit that writes no rows; returns its version.

        Files written before read the new columns as null. Losing a race to another writer adding the
        same columns is fine (the version returned is then the table's newest).
        """

    def append(self, path: Location, data: pa.RecordBatchReader | pa.Table, *, app_id: str | None = None,
               app_version: int | None = None, metadata: Mapping[str, str] | None = None,
               app_transactions: Sequence[tuple[str, int]] = ()) -> int:
        """Append ``data`` in one commit and return its version.

        With ``app_id``/``app_version`` the commit records an application transaction, so a retry
        of the same (app_id, app_version) can be detected with ``transaction_version``.
        ``app_transactions`` records several more (app_id, app_version) pairs in the same commit
        (group commit of several requests, each with its own id).
        """

    def appender(self, path: Location) -> Appender:
        """A long-lived writer for the existing table at ``path`` (see :class:`Appender`)."""

    def transaction_version(self, path: Location, app_id: str) -> int | None:
        """The last application-transaction version committed for ``app_id``, or None."""

    def snapshot(self, spark: SparkSession, path: Location, version: int, schema: pa.Schema) -> DataFrame:
        """The table as of ``version``, read by Spark (distributed)."""

    def commit_files(self, path: Location, files: Sequence[Location], schema: pa.Schema, *, app_id: str,
                     app_version: int, metadata: Mapping[str, str]) -> int | None:
        """Replace the table's content with parquet ``files`` (written under ``path``; URIs or paths) in one commit.

        Idempotent per (app_id, app_version): returns None, committing nothing, when that
        transaction is already in the log.
        """

    def compact(self, path: Location, *, target_size: int | None = None,
                metadata: Mapping[str, str] | None = None) -> CompactionResult:
        """Rewrite small files into larger ones in one commit that changes no data (``dataChange = false``,
        so change-feed readers skip it); safe alongside concurrent appends."""


@dataclass(frozen=True)
class GenerationCommit:
    """Where a generation written by :meth:`SparkStorage.write_generation` landed."""

    version: int
    rows: int


class IngestedFile(Protocol):
    """What a bulk ingest committed: ``events`` rows at master ``version``."""

    events: int
    version: int


@runtime_checkable
class SparkStorage(Protocol):
    """Operations of an engine whose Delta runs inside Spark (delta-spark): Spark writes and reads
    the tables itself, distributed, with Delta's own transactions."""

    def write_generation(self, rows: DataFrame, path: Location, *, app_id: str, app_version: int,
                         metadata: Mapping[str, str]) -> GenerationCommit | None:
        """Replace the table's content with ``rows`` in one commit recording (app_id, app_version).

        Idempotent: None, committing nothing, when that transaction (or a later one) is recorded.
        """

    def read_version(self, spark: SparkSession, path: Location, version: int) -> DataFrame:
        """The table as of ``version``."""

    def ingest_events_file(self, path: Location, file: Path, file_format: str, schema: EventSchema, *,
                           metadata: Mapping[str, str]) -> IngestedFile | None:
        """Append an event file (``file_format``: see ``file_formats.FORMATS``) validated against ``schema``
        in one commit: all of it, or on any bad line or row none of it (EventValidationError listing every
        problem by line or row and field, as ``MasterDataset.ingest_file``). None when this process runs
        no Spark, or Spark does not read this format (the caller ingests another way)."""

    def compact(self, path: Location, *, target_size: int | None = None,
                metadata: Mapping[str, str] | None = None) -> CompactionResult:
        """As :meth:`StorageEngine.compact`, run by Spark."""

    def change_stream(self, spark: SparkSession, path: Location, schema: pa.Schema, *, after: int,
                      version_column: str, max_files: int, max_rows: int | None) -> DataFrame:
        """Rows inserted after version ``after`` as a streaming DataFrame: ``schema``'s columns and
        ``version_column``, the commit that added the row."""
