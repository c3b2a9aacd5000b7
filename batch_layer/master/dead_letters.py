"""Dead letters: the events a path refused, kept with their raw text, where they came from and why.

Each pipeline has one dead-letter Delta table beside its master dataset. A row is one refused
record: its raw text (as received; bytes that are not UTF-8 are kept as ``\\x..`` escapes), its
source ('kafka', 'file', 'backfill' or 'transform') with its coordinates (topic/partition/offset,
or file and line), the first field at fault and every problem in words, and when it was refused.

Guarantees: a write is one commit, all of its letters or none. A writer that replays (a streaming
micro-batch after a crash) passes its application transaction (``app_id``, ``app_version``), and
a version already recorded commits nothing, so a letter is never kept twice. Nothing here ever
raises for the content of a letter: a dead-letter path must not become a second way to stop.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from typing import Protocol, runtime_checkable

import pyarrow as pa
import pyarrow.compute as pc

from batch_layer.errors import StorageError
from batch_layer.master.delta_log import LogHead, open_table
from batch_layer.master.engines import get_engine
from batch_layer.master.object_store import Location
from batch_layer.master.storage import CommitConflictError, StorageEngine
from shared_logic.errors import EventProblem

log = logging.getLogger(__name__)

#: Where a dead letter came from.
SOURCES = ("kafka", "file", "backfill", "transform")

#: The dead-letter table's columns (every one nullable but the raw text, source, reason and time).
SCHEMA = pa.schema([
    pa.field("id", pa.string(), nullable=False),
    pa.field("raw", pa.string(), nullable=False),
    pa.field("source", pa.string(), nullable=False),
    pa.field("topic", pa.string()),
    pa.field("partition", pa.int32()),
    pa.field("offset", pa.int64()),
    pa.field("file", pa.string()),
    pa.field("line", pa.int64()),
    pa.field("field", pa.string()),
    pa.field("reason", pa.string(), nullable=False),
    pa.field("dead_at", pa.timestamp("us", tz="UTC"), nullable=False),
    # Added after the first tables were written: an older table gains it on its next append (``_fit``).
    pa.field("record_time", pa.timestamp("us", tz="UTC")),
])

#: Longest raw text kept per letter (a record past it is kept cut, with the cut said in the reason).
RAW_LIMIT = 64 * 1024


@dataclass(frozen=True)
class DeadLetter:
    """One refused record: what it was, where it came from, why it was refused."""

    raw: str  # bytes are accepted and kept as text (``raw_text``)
    source: str
    reason: str
    field: str | None = None
    topic: str | None = None
    partition: int | None = None
    offset: int | None = None
    file: str | None = None
    line: int | None = None
    dead_at: datetime = dataclasses.field(default_factory=lambda: datetime.now(timezone.utc))
    #: Kafka: the record's own timestamp (None when it has none), the event time a replay gives an event
    #: without one, as the ingest would have (never the time it was refused).
    record_time: datetime | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.raw, str) or len(self.raw) > RAW_LIMIT:  # bytes, None, or too long: kept as text
            object.__setattr__(self, "raw", raw_text(self.raw))

    @property
    def id(self) -> str:
        """The letter's identity: the same record refused at the same place is the same letter (a replay of
        the same records keeps no second copy, and ``dead-letters replay`` ingests each letter once)."""
        where = (self.source, self.topic, self.partition, self.offset, self.file, self.line, self.raw)
        return hashlib.sha256(json.dumps(where).encode()).hexdigest()[:32]

    def row(self) -> dict[str, object]:
        return {"id": self.id, **asdict(self)}

    @classmethod
    def of_problems(cls, raw: str | bytes | None, source: str, problems: Sequence[EventProblem],
                    **where: object) -> DeadLetter:
        """A letter for a record refused with ``problems`` (its first problem names the field)."""
        reason = "; ".join(f"field {p.field!r}: {p.message}" for p in problems) or "refused"
        return cls(raw=raw_text(raw), source=source, reason=reason,
                   field=problems[0].field if problems else None, **where)  # type: ignore[arg-type]


def raw_text(raw: str | bytes | None) -> str:
    """A record's raw value as text: UTF-8 decoded (other bytes escaped), cut at ``RAW_LIMIT`` characters."""
    if raw is None:
        return ""
    text = raw.decode("utf-8", errors="backslashreplace") if isinstance(raw, bytes) else raw
    return text if len(text) <= RAW_LIMIT else text[:RAW_LIMIT] + f"... [cut: {len(text)} characters]"


@runtime_checkable
class DeadLetterConfig(Protocol):
    """Where a pipeline's dead-letter table lives and which engine writes it."""

    @property
    def dead_letters_uri(self) -> str: ...

    @property
    def storage_engine(self) -> str: ...


@dataclass(frozen=True)
class DeadLetterPage:
    """One page of a pipeline's dead letters (oldest first) and how many match in all."""

    letters: list[dict[str, object]]
    total: int


class DeadLetters:
    """A pipeline's dead-letter table on a storage engine."""

    def __init__(self, path: Location, pipeline: str, engine: StorageEngine) -> None:
        self.path, self.pipeline, self.engine = path, pipeline, engine
        self._counting = _Counts(path)
        self._fits = False  # the table holds every column of SCHEMA (checked by this instance's first append)

    @classmethod
    def open(cls, config: DeadLetterConfig, pipeline: str) -> DeadLetters:
        return cls(config.dead_letters_uri, pipeline, get_engine(config.storage_engine))

    def append(self, letters: Sequence[DeadLetter], *, app_id: str | None = None,
               app_version: int | None = None) -> int | None:
        """Keep ``letters`` in one commit; its version, or None when there was nothing to keep or the
        application transaction ``(app_id, app_version)`` is already recorded (a replay)."""
        if not letters:
            return None
        self._fit()
        rows = pa.Table.from_pylist([letter.row() for letter in letters], schema=SCHEMA)
        try:
            txns = [(app_id, app_version)] if app_id is not None and app_version is not None else []
            version = self.engine.append(self.path, rows, app_transactions=txns,  # a table: retried safely
                                         metadata={"lambda.dead_letters": letters[0].source})
        except CommitConflictError:
            return None  # the transaction is recorded already: a replay, or another writer first
        log.warning("%d dead letter(s) of pipeline %s kept at version %d (first: %s)", len(letters),
                    self.pipeline, version, letters[0].reason[:200])
        return version

    def _fit(self) -> None:
        """Create the table, or give one an older release wrote the columns SCHEMA gained since (one commit,
        no data rewritten; its letters read them as null)."""
        if self._fits:
            return
        state = self.engine.table_state(self.path)
        missing = [f for f in SCHEMA if state is not None and f.name not in state.schema.names]
        if missing:
            version = self.engine.add_columns(self.path, missing, metadata={
                "lambda.schema": "add " + ", ".join(f.name for f in missing)})
            log.info("dead letters of pipeline %s: added the columns %s at version %d", self.pipeline,
                     ", ".join(f.name for f in missing), version)
        self.engine.ensure_table(self.path, SCHEMA, name=f"dead_letters_{self.pipeline}", change_feed=False)
        self._fits = True

    def keep(self, letters: Sequence[DeadLetter]) -> int | None:
        """Keep, in one commit, the letters not kept yet: a letter whose id the table holds already (the
        same record refused at the same place, by a rerun of the same file) is not kept twice. Its
        version, or None when there was nothing new to keep."""
        unique = list({letter.id: letter for letter in letters}.values())
        if not unique:
            return None
        known = set(self._read(ids=[letter.id for letter in unique], columns=["id"])["id"].to_pylist())
        return self.append([letter for letter in unique if letter.id not in known])

    def counts(self) -> dict[str, int]:
        """Letters per source, cheaply enough for every metrics scrape (see ``_Counts``)."""
        return self._counting.read()

    def count(self) -> int:
        return self.page(limit=0).total

    def page(self, *, source: str | None = None, reason: str | None = None, offset: int = 0,
             limit: int = 100, newest_first: bool = False) -> DeadLetterPage:
        """Letters oldest first (newest first with ``newest_first``), filtered by ``source`` (exact) and
        ``reason`` (case-insensitive substring), ``limit`` from ``offset``."""
        table = self._selected(None, source, reason, newest_first)
        return DeadLetterPage(table.slice(offset, limit).to_pylist() if limit else [], table.num_rows)

    def select(self, *, ids: Sequence[str] | None = None, source: str | None = None,
               reason: str | None = None) -> list[dict[str, object]]:
        """Every letter with one of ``ids`` (all letters: None), of ``source``, whose reason holds ``reason``,
        oldest first (what ``dead-letters replay`` replays)."""
        return self._selected(ids, source, reason, newest_first=False).to_pylist()

    def _selected(self, ids: Sequence[str] | None, source: str | None, reason: str | None,
                  newest_first: bool) -> pa.Table:
        table = self._read(ids=ids)
        keep = _matching(table, source, reason)
        if keep is not None:
            table = table.filter(keep)
        return table.sort_by([("dead_at", "descending" if newest_first else "ascending"), ("id", "ascending")])

    def _read(self, *, ids: Sequence[str] | None = None, columns: list[str] | None = None) -> pa.Table:
        if self.engine.latest_version(self.path) is None:
            empty = SCHEMA.empty_table()
            return empty.select(columns) if columns else empty
        try:
            dataset = open_table(self.path).to_pyarrow_dataset()
            found = dataset.to_table(columns=columns, filter=None if ids is None else pc.field("id").isin(list(ids)))
        except Exception as e:  # delta-rs raises several kinds for an unreadable table
            raise StorageError(f"cannot read the dead letters of pipeline {self.pipeline} at {self.path}: {e}") from e
        if columns:
            return found
        for field in SCHEMA:  # a table an older release wrote, before its next append adds the column (``_fit``)
            if field.name not in found.column_names:
                found = found.append_column(field, pa.nulls(found.num_rows, field.type))
        return found.select(SCHEMA.names).cast(SCHEMA)


class _Counts:
    """A dead-letter table's letters per source, kept up to date cheaply: while the table's version is
    unchanged a call reads only the log's new commits (``LogHead``); after a new version, only the
    ``source`` column of the data files added since the last count (the table is append-only; should a
    counted file be gone, after a compaction say, everything is counted again). Thread-safe."""

    def __init__(self, path: Location) -> None:
        self.path = path
        self._head = LogHead(path)
        self._lock = threading.Lock()
        self._version: int | None = None
        self._files: set[str] = set()
        self._counts: Counter[str] = Counter()

    def read(self) -> dict[str, int]:
        with self._lock:
            version = self._head.version()
            if version is None:
                return {}
            if version != self._version:
                fragments = {f.path: f for f in open_table(self.path, version).to_pyarrow_dataset().get_fragments()}
                if not self._files <= fragments.keys():
                    self._files, self._counts = set(), Counter()
                for name, fragment in fragments.items():
                    if name not in self._files:
                        for item in pc.value_counts(fragment.to_table(columns=["source"])["source"]).to_pylist():
                            self._counts[str(item["values"])] += int(item["counts"])
                        self._files.add(name)
                self._version = version
            return dict(self._counts)


class DeadLetterWriteError(StorageError):
    """An ingest committed a file's valid records to the master dataset, then failed to keep its bad
    records as dead letters: the message says where the events are and lists every bad record (do not
    ingest the file again: its valid records would be appended twice)."""

    def __init__(self, file: object, events: int, version: int, letters: Sequence[DeadLetter],
                 error: Exception) -> None:
        shown = "\n  ".join(f"line {letter.line}: {letter.reason}" for letter in letters[:20])
        more = f"\n  ... and {len(letters) - 20} more" if len(letters) > 20 else ""
        super().__init__(f"{events} valid events of {file} were committed at master version {version}, but its "
                         f"{len(letters)} bad record(s) could not be kept as dead letters ({error}); do not ingest "
                         f"the file again (its valid events would be appended twice). The bad records:\n  "
                         f"{shown}{more}")


def _matching(table: pa.Table, source: str | None, reason: str | None) -> pa.ChunkedArray | None:
    tests: list[Callable[[], pa.ChunkedArray]] = []
    if source is not None:
        tests.append(lambda: pc.equal(table["source"], source))
    if reason is not None:
        tests.append(lambda: pc.match_substring(table["reason"], reason, ignore_case=True))
    keep = None
    for test in tests:
        keep = test() if keep is None else pc.and_(keep, test())
    return keep
