"""The storage engine interface: how the layers read and write Delta tables.

The layers never call a Delta library directly; they go through a :class:`StorageEngine`, so a
JVM engine (delta-spark, for clusters) can stand beside the embedded delta-rs engine without
touching them. Engines are registered by name in ``ENGINES``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import pyarrow as pa

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


class StorageEngine(Protocol):
    """Delta Lake operations the platform needs. Every write is one atomic Delta commit."""

    def ensure_table(self, path: Path, schema: pa.Schema, *, name: str, change_feed: bool) -> None:
        """Create the table if it does not exist (safe when several processes race to create it)."""

    def latest_version(self, path: Path) -> int | None:
        """The newest committed version, or None when there is no table at ``path``."""

    def append(self, path: Path, data: pa.RecordBatchReader, *, app_id: str | None = None,
               app_version: int | None = None, metadata: Mapping[str, str] | None = None) -> int:
        """Append ``data`` in one commit and return its version.

        With ``app_id``/``app_version`` the commit records an application transaction, so a retry
        of the same (app_id, app_version) can be detected with ``transaction_version``.
        """

    def transaction_version(self, path: Path, app_id: str) -> int | None:
        """The last application-transaction version committed for ``app_id``, or None."""

    def snapshot(self, spark: SparkSession, path: Path, version: int, schema: pa.Schema) -> DataFrame:
        """The table as of ``version``, read by Spark (distributed)."""

    def commit_files(self, path: Path, files: Sequence[Path], schema: pa.Schema, *, app_id: str,
                     app_version: int, metadata: Mapping[str, str]) -> int | None:
        """Replace the table's content with parquet ``files`` (written under ``path``) in one commit.

        Idempotent per (app_id, app_version): returns None, committing nothing, when that
        transaction is already in the log.
        """


def get_engine(name: str) -> StorageEngine:
    """The engine registered as ``name`` (see ``Settings.storage_engine``)."""
    from batch_layer.delta_rs import DeltaRsEngine

    engines: dict[str, type] = {"delta-rs": DeltaRsEngine}
    try:
        return engines[name]()
    except KeyError:
        from batch_layer.errors import StorageError

        raise StorageError(f"unknown storage engine {name!r}; known engines: {', '.join(engines)}") from None
