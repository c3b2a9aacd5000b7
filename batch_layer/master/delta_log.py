"""The one reader of a Delta table's log: its commits, its newest version and its change feed.

A commit file ``_delta_log/<version:020d>.json`` is newline-delimited JSON, one action per line
(Delta protocol, "Delta Log Entries"). Lines are split on "\\n" only: JSON escapes every control
character inside strings, but not U+0085, U+2028 or U+2029, and delta-rs writes those unescaped
(in column statistics, commit metadata, application ids), so ``str.splitlines()`` or any other
reader of "universal newlines" cuts a line in two. A "\\r" before the "\\n" and blank lines are
tolerated; bytes are decoded as UTF-8 whatever the locale.

Every module that needs the log reads it here; nothing else opens ``_delta_log`` files. Works for
any Delta table, whichever engine wrote it (the newest version and the change feed are read
through delta-rs, which reads every Delta table), wherever it lives: a location is a local path or
an ``s3://`` URI (``batch_layer.master.object_store``); commit files are read through its filesystem
and every delta-rs handle is opened here, by :func:`open_table`, with the location's storage options.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from batch_layer.errors import StorageError
from batch_layer.master.object_store import (
    Location,
    delete_files,
    join,
    list_files,
    read_bytes,
    storage_options,
    table_uri,
)

__all__ = ["Commit", "DeltaLogError", "LogHead", "LogTrim", "change_feed", "commit_path", "inserted_rows", "commit_uri",
           "newest_version", "open_table", "parse_actions", "read_commit", "trim_log"]


class DeltaLogError(StorageError):
    """A commit file of a Delta log is not what the protocol says (not one JSON object per line)."""


@dataclass(frozen=True)
class Commit:
    """One commit of a Delta table: its version and its actions, in file order."""

    version: int
    actions: tuple[Mapping[str, Any], ...]

    @property
    def info(self) -> Mapping[str, Any]:
        """The commit's ``commitInfo`` (custom metadata included), or empty if it has none."""
        for action in self.actions:
            info = action.get("commitInfo")
            if isinstance(info, Mapping):
                return info
        return {}

    @property
    def timestamp(self) -> float | None:
        """When the commit was made, epoch seconds (``commitInfo.timestamp``), or None if not recorded."""
        stamp = self.info.get("timestamp")
        return stamp / 1000 if isinstance(stamp, (int, float)) else None

    @property
    def app_transactions(self) -> dict[str, int]:
        """The application transactions it records: app id -> app version (``txn`` actions)."""
        txns = (a["txn"] for a in self.actions if isinstance(a.get("txn"), Mapping))
        return {t["appId"]: t["version"] for t in txns if "appId" in t}

    @property
    def changes_data(self) -> bool:
        """Whether readers see other rows after it: an ``add`` or ``remove`` with ``dataChange`` (or a
        ``metaData`` change). Compaction (OPTIMIZE) and VACUUM commits do not."""
        for action in self.actions:
            if "metaData" in action:
                return True
            for kind in ("add", "remove"):
                body = action.get(kind)
                if isinstance(body, Mapping) and body.get("dataChange", True):
                    return True
        return False

    def records_transaction(self, app_id: str) -> bool:
        return app_id in self.app_transactions

    @property
    def rows_added(self) -> int:
        """Rows its data-changing ``add`` actions hold, from their statistics' ``numRecords``.

        Compaction commits (``dataChange = false``) add 0; a file without statistics counts 0.
        """
        rows = 0
        for action in self.actions:
            add = action.get("add")
            if isinstance(add, Mapping) and add.get("dataChange", True) and add.get("stats"):
                rows += json.loads(add["stats"]).get("numRecords", 0)
        return rows


def open_table(table: Location, version: int | None = None) -> DeltaTable:
    """A delta-rs handle on the table at ``table`` (as of ``version``; default the newest), opened
    with the location's storage options. Raises deltalake's TableNotFoundError when there is none."""
    uri = table_uri(table)
    return DeltaTable(uri, version=version, storage_options=storage_options(uri) or None)


def commit_path(table: Path | str, version: int) -> Path:
    """The commit file of ``version`` in the log of the local table at ``table``."""
    return Path(table) / "_delta_log" / f"{version:020d}.json"


def commit_uri(table: Location, version: int) -> str:
    """The commit file of ``version`` in the log of the table at ``table``, local path or URI."""
    return join(table, "_delta_log", f"{version:020d}.json")


def read_commit(table: Location, version: int) -> Commit | None:
    """Commit ``version`` of the table at ``table``; None when its file is not in the log (not
    committed yet, or cleaned up after the log retention). Raises DeltaLogError on a malformed file."""
    uri = commit_uri(table, version)
    data = read_bytes(uri)
    if data is None:
        return None
    return Commit(version, tuple(parse_actions(data, source=uri)))


def parse_actions(data: bytes, *, source: str = "commit file") -> list[dict[str, Any]]:
    """The actions of a commit file's content: one JSON object per "\\n"-terminated line."""
    actions = []
    for number, line in enumerate(data.split(b"\n"), start=1):
        if not line.strip():  # bytes.strip: ASCII whitespace only, so a blank line or a lone "\r"
            continue
        try:
            action = json.loads(line)  # UTF-8 bytes; a trailing "\r" is JSON whitespace
        except ValueError as e:
            raise DeltaLogError(f"{source}, line {number}: not a JSON action ({e}); the Delta log is damaged") from e
        if not isinstance(action, dict):
            raise DeltaLogError(f"{source}, line {number}: a Delta action must be a JSON object, not {action!r:.40}")
        actions.append(action)
    return actions


def newest_version(table: Location) -> int | None:
    """The newest committed version of the table at ``table``, or None when there is no table."""
    try:
        return open_table(table).version()
    except TableNotFoundError:
        return None


class LogHead:
    """The newest version of one table, kept by one handle that reads only the commits since its
    last look (cheaper than :func:`newest_version` for a caller that asks again and again).
    Not thread-safe: one caller at a time."""

    def __init__(self, table: Location) -> None:
        self.table = table
        self._handle: DeltaTable | None = None

    def version(self, *, refresh: bool = True) -> int | None:
        """The newest version (read anew with ``refresh``, else as of the last look); None when there
        is no table yet."""
        try:
            if self._handle is None:
                self._handle = open_table(self.table)
            elif refresh:
                self._handle.update_incremental()
        except TableNotFoundError:
            return None
        return self._handle.version()


def change_feed(table: Location, first: int, last: int, columns: list[str] | None = None) -> Iterator[pa.RecordBatch]:
    """The change data feed of versions ``first..last`` (both inclusive), as delta-rs gives it:
    the table's columns plus ``_change_type``, ``_commit_version``, ``_commit_timestamp``, in log
    order (types as delta-rs yields them, e.g. string_view; cast before compute). Compaction
    commits carry no change data. Needs ``delta.enableChangeDataFeed`` set at creation."""
    stream = open_table(table).load_cdf(starting_version=first, ending_version=last, columns=columns)
    yield from pa.RecordBatchReader.from_stream(stream)


def inserted_rows(table: Location, first: int, last: int, schema: pa.Schema, *, version_column: str,
                  project: bool = False) -> Iterator[pa.RecordBatch]:
    """The rows versions ``first..last`` inserted, cast to ``schema``, whose ``version_column`` is the commit
    that added each row (a column added to the table after a row's commit is null in it). ``project``: read
    ``schema``'s columns only (the table's others are not read at all)."""
    columns = [n for n in schema.names if n != version_column] + ["_change_type", "_commit_version"]
    for batch in change_feed(table, first, last, columns if project else None):
        # delta-rs yields string_view / uint64 columns: cast to the declared types before any compute.
        inserted = pc.equal(batch.column("_change_type").cast(pa.string()), "insert")
        columns = []
        for field in schema:
            source = "_commit_version" if field.name == version_column else field.name
            if batch.schema.get_field_index(source) < 0:  # a column added after these rows: null (delta-rs fills it too)
                columns.append(pa.nulls(batch.num_rows, field.type))
                continue
            columns.append(batch.column(source).cast(field.type))
        rows = pa.RecordBatch.from_arrays(columns, schema=schema).filter(inserted)
        if rows.num_rows:
            yield rows


#: Log files ``trim_log`` may delete: commits (and their ``.crc`` checksums) and classic checkpoints
#: (single or multi-part). Anything else in ``_delta_log`` (``_last_checkpoint``, v2 checkpoints and
#: their sidecars, log compactions) is never touched.
_COMMIT_FILE = re.compile(r"(\d{20})\.(?:json|crc)")
_CHECKPOINT_FILE = re.compile(r"(\d{20})\.checkpoint(?:\.\d{10}\.\d{10})?\.parquet")


@dataclass(frozen=True)
class LogTrim:
    """What ``trim_log`` did: the checkpoint the log now starts at (None: no checkpoint at or below
    the version to keep, nothing deleted) and how many files it deleted."""

    starts_at: int | None
    deleted: int


def trim_log(table: Location, keep_from: int) -> LogTrim:
    """Delete the log files no reader of version ``keep_from`` or later needs.

    A reader of version V loads the newest checkpoint at or below V and the commits after it. So
    with C the newest checkpoint at or below ``keep_from``, every commit file before C and every
    older checkpoint can go: versions ``keep_from`` and later (time travel, a snapshot, a
    streaming source resuming there) read exactly as before; versions before C can no longer be
    loaded. Nothing is rewritten, and no commit is added (readers and the speed layer see no new
    version). Each writer's commit cost grows with the number of commit files a listing of the log
    returns, which is what this keeps small. An idempotency key committed before C stays known to
    the table (its transaction is in the checkpoint); only its first answer is no longer found.
    """
    folder = join(table, "_delta_log")
    files = [(uri.rsplit("/", 1)[-1], uri) for uri, _ in list_files(folder)]
    checkpoints = sorted({int(m.group(1)) for name, _ in files if (m := _CHECKPOINT_FILE.fullmatch(name))})
    below = [c for c in checkpoints if c <= keep_from]
    if not below:
        return LogTrim(None, 0)
    start = below[-1]
    doomed = [uri for name, uri in files
              if ((m := _COMMIT_FILE.fullmatch(name)) or (m := _CHECKPOINT_FILE.fullmatch(name))) and int(m.group(1)) < start]
    delete_files(doomed)
    return LogTrim(start, len(doomed))
