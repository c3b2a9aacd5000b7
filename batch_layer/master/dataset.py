"""The master dataset: one append-only Delta table per pipeline, the platform's source of truth.

Rows never change. Every commit is a version, and versions are the platform's clock: a row's
``_version`` is the Delta commit version that added it, read from the log (change data feed),
never written into the files, so no writer can get it wrong. Besides events the table holds
barrier rows (``_kind = 'barrier'``), appended by each batch run to mark the version it
recomputes; barrier rows never reach a view.
"""

from __future__ import annotations

import itertools
import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import pyarrow as pa
from pyspark.sql import functions as F

from batch_layer.errors import EmptyMasterError, IngestError
from batch_layer.master.dead_letters import DeadLetter, DeadLetters, DeadLetterWriteError
from batch_layer.master.delta_log import LogTrim, read_commit, trim_log
from batch_layer.master.engines import get_engine
from batch_layer.master.file_formats import SourceFile, source_files, validated_chunks
from batch_layer.master.file_sorting import sorted_chunks
from batch_layer.master.object_store import Location
from batch_layer.master.schema_evolution import SchemaEvolution, plan_evolution
from batch_layer.master.storage import Appender, CompactionResult, SparkStorage, StorageEngine
from batch_layer.master.vacuum import Vacuumed, vacuum_table
from shared_logic.errors import EventProblem, EventValidationError
from shared_logic.events import KIND_COLUMN
from shared_logic.pipeline import Pipeline

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

#: Events (lines, rows) validated and converted per chunk while ingesting a file (bounds memory).
INGEST_CHUNK_LINES = 100_000


@dataclass(frozen=True)
class IngestResult:
    """What an ingest committed: how many events, at which master version (and how many dead letters)."""

    events: int
    version: int
    #: Bad lines or rows kept as dead letters (ingest with dead letters; else 0).
    dead_letters: int = 0


class MasterConfig(Protocol):
    """Where a pipeline's master dataset lives and which engine reads and writes it.

    The layers above define their own configuration protocols on top of this one; only ``deploy``
    knows the settings class that satisfies them all.
    """

    @property
    def master_uri(self) -> str:
        """The table's location: an absolute local path or an ``s3://`` URI (``object_store``)."""
        ...

    @property
    def storage_engine(self) -> str: ...


class MasterDataset:
    """The pipeline's master dataset on a storage engine."""

    def __init__(self, path: Location, pipeline: Pipeline, engine: StorageEngine) -> None:
        self.path, self.pipeline, self.engine = path, pipeline, engine
        self.schema = pipeline.schema.arrow_schema()
        #: The table's schema was checked (and evolved) by this instance: later ensures skip it.
        self._schema_fits = False

    @classmethod
    def open(cls, config: MasterConfig, pipeline: Pipeline) -> MasterDataset:
        """The master dataset of ``pipeline`` where ``config`` says, on its engine (the one way to open it)."""
        return cls(config.master_uri, pipeline, get_engine(config.storage_engine))

    def ensure(self) -> None:
        """Create the table (change data feed on) if it does not exist yet; if it does, make it hold the
        event model's fields (``schema_evolution``): add new optional fields' columns in one commit, or
        raise SchemaChangeError (nothing written) for a removed or retyped field or a new required one.

        Every write calls it first; the schema is checked by the first call of this instance only.
        """
        if not self._schema_fits:
            evolution = self.check_schema()
            if evolution:
                version = self.engine.add_columns(self.path, evolution.added,
                                                  metadata={"lambda.schema": "add " + ", ".join(evolution.names)})
                log.info("master dataset at %s: added the event model's new fields %s as columns at version %d "
                         "(older rows read them as null)", self.path, ", ".join(evolution.names), version)
        self.engine.ensure_table(self.path, self.schema, name=f"master_{self.pipeline.name}", change_feed=True)
        self._schema_fits = True

    def check_schema(self) -> SchemaEvolution:
        """What :meth:`ensure` would change to fit the event model (columns to add; nothing for a table
        that does not exist yet), writing nothing; SchemaChangeError when the model cannot fit the table
        (see ``schema_evolution``). Commands call it (or ``ensure``) at start, so they refuse at once."""
        state = self.engine.table_state(self.path)
        if state is None:
            return SchemaEvolution()
        return plan_evolution(state.schema, self.pipeline.schema, holds_rows=state.files > 0, where=str(self.path))

    def latest_version(self) -> int:
        version = self.engine.latest_version(self.path)
        if version is None:
            raise EmptyMasterError(f"no master dataset at {self.path} yet: ingest events first (`lambda-platform ingest FILE`)")
        return version

    def holds_data(self) -> bool:
        """True once anything was appended; a missing table, or one just created (version 0, the
        creating commit, holds no rows), holds nothing to recompute."""
        version = self.engine.latest_version(self.path)
        return version is not None and version > 0

    def compact(self) -> CompactionResult:
        """Rewrite the table's small files into large ones (OPTIMIZE), in one commit that changes no data.

        Rows, versions and every snapshot stay as they were: the commit is ``dataChange = false``,
        so the speed layer's change feed skips it, and time travel to older versions still reads
        the old files. Safe while ingest appends. Its result's ``version`` is None when there was
        nothing to compact.
        """
        result = self.engine.compact(self.path, metadata={"lambda.compaction": "master"})
        if result.version is not None:
            log.info("master dataset compacted at version %d: %d files into %d", result.version,
                     result.files_removed, result.files_added)
        return result

    def data_changed(self, after: int, through: int) -> bool:
        """Whether any commit after version ``after`` through ``through`` changes rows (a compaction or a
        VACUUM does not; a commit file no longer in the log counts as a change)."""
        for version in range(after + 1, through + 1):
            commit = read_commit(self.path, version)
            if commit is None or commit.changes_data:
                return True
        return False

    def vacuum(self, keep_from: int, *, floor_hours: float) -> Vacuumed:
        """Delete the files compactions removed that no version from ``keep_from`` on reads, once their
        removal is ``floor_hours`` old (``batch_layer.master.vacuum``)."""
        done = vacuum_table(self.path, keep_from, floor_hours=floor_hours, what="the master dataset")
        if done.files_deleted:
            log.info("master dataset vacuumed: %d files deleted (retention %d h, every version from %d kept)",
                     done.files_deleted, done.retention_hours, keep_from)
        return done

    def trim_log(self, keep_from: int) -> LogTrim:
        """Delete the log's commit files no reader of version ``keep_from`` or later needs
        (``delta_log.trim_log``): what keeps each ingest commit as cheap as on a fresh table."""
        trimmed = trim_log(self.path, keep_from)
        if trimmed.deleted:
            log.info("master dataset log trimmed: %d files before the checkpoint at version %s (keeping every "
                     "version from %d)", trimmed.deleted, trimmed.starts_at, keep_from)
        return trimmed

    def append(self, events: pa.Table | pa.RecordBatchReader, **txn: object) -> int:
        """Append already-validated events in one commit; returns the master version holding them.

        ``txn``: the engine's ``append`` options (``app_id``/``app_version``, ``app_transactions``
        for several application transactions in the one commit, ``metadata``).
        """
        self.ensure()  # a table (not a stream) is retried safely on a transient I/O fault
        return self.engine.append(self.path, events, **txn)  # type: ignore[arg-type]

    def appender(self) -> Appender:
        """A long-lived writer for streams of small commits (HTTP ingest); creates the table if needed.

        Its ``append`` takes already-validated events (``self.schema``), like :meth:`append`.
        """
        self.ensure()
        return self.engine.appender(self.path)

    def append_barrier(self, run_id: str) -> int:
        """Append a barrier row and return its version V: the version a batch run recomputes."""
        self.ensure()
        row: dict[str, list[str | None]] = {name: [None] for name in self.schema.names}
        row[KIND_COLUMN] = ["barrier"]
        barrier = pa.table(row, schema=self.schema)
        return self.engine.append(self.path, barrier.to_reader(), metadata={"lambda.barrier": run_id})

    def snapshot(self, spark: SparkSession, version: int) -> DataFrame:
        """The event rows (no barriers) of the master dataset as of ``version``."""
        rows = self.engine.snapshot(spark, self.path, version, self.schema)
        return rows.where(F.col(KIND_COLUMN) == "event").drop(KIND_COLUMN)

    def ingest_file(self, file: Path | SourceFile, *, on_rows: Callable[[int], None] | None = None,
                    dead_letters: DeadLetters | None = None, letter_source: str = "file") -> IngestResult:
        """Append an event file (JSON Lines, CSV or Parquet: ``file_formats``) as one commit: all of it,
        or (on any bad line or row) none of it.

        A path's format comes from its extension. The file is validated and converted in chunks, so its
        size is bounded by disk, not memory. Every problem is reported with its line (or row) number and
        field (EventValidationError). ``on_rows`` is told how many events each validated chunk held.

        With ``dead_letters`` a bad line or row no longer stops the file: its valid records are committed
        (one commit; none when it has none) and then each bad one is kept in ``dead_letters`` (one
        commit) with its raw text, the file, its line (or row) number, the first field at fault and every
        problem, source ``letter_source`` ('file' or 'backfill'); ``IngestResult.dead_letters`` counts
        them. Problems of the file's structure (a CSV header, a Parquet schema, text that is not UTF-8)
        still refuse all of it. The master commit comes first: if it fails nothing is kept; if keeping the
        letters fails after it, DeadLetterWriteError says the events are committed and lists the bad
        records. Letters are held in memory until then. A rerun of the same file appends its valid
        records again (a file ingest is no more idempotent with the option than without) and keeps no
        second copy of a letter already kept (the same file, line and text: the same id). On the
        delta-spark engine the file is then validated in this process, as on delta-rs (Spark's bulk path
        knows all or nothing only), and appended through the engine in one commit.
        """
        source = file if isinstance(file, SourceFile) else source_files([file])[0]
        if not source.path.is_file():
            raise IngestError(f"cannot ingest {source.path}: no such file")
        metadata = {"lambda.source": source.path.name}
        if dead_letters is not None:
            return self._ingest_sorting(source, metadata, _Counter(on_rows=on_rows), dead_letters, letter_source)
        if isinstance(self.engine, SparkStorage):  # read, validated and appended by Spark (None: no Spark here)
            self.ensure()
            bulk = self.engine.ingest_events_file(self.path, source.path, source.format, self.pipeline.schema,
                                                  metadata=metadata)
            if bulk is not None:
                log.info("ingested %d events from %s at master version %d", bulk.events, source.path, bulk.version)
                if on_rows is not None:
                    on_rows(bulk.events)
                return IngestResult(bulk.events, bulk.version)
        counter = _Counter(on_rows=on_rows)
        batches = self._validated_batches(source, counter)
        version = self._append_counted(pa.RecordBatchReader.from_batches(self.schema, batches), counter, metadata)
        log.info("ingested %d events from %s at master version %d", counter.events, source.path, version)
        return IngestResult(counter.events, version)

    def _append_counted(self, reader: pa.RecordBatchReader, counter: _Counter, metadata: dict[str, str]) -> int:
        try:
            return self.append(reader, metadata=metadata)
        except Exception:
            # delta-rs wraps what the batch generator raised; hand back the original, typed error.
            if counter.error is not None:
                raise counter.error from None
            raise

    def _ingest_sorting(self, source: SourceFile, metadata: dict[str, str], counter: _Counter,
                        dead_letters: DeadLetters, letter_source: str) -> IngestResult:
        """``ingest_file`` with dead letters: the valid records in one master commit, then the letters."""
        letters: list[DeadLetter] = []
        where = str(source.path.resolve())

        def batches() -> Iterator[pa.RecordBatch]:
            try:
                for chunk in sorted_chunks(source, self.pipeline.schema, chunk_rows=INGEST_CHUNK_LINES):
                    letters.extend(DeadLetter.of_problems(r.raw, letter_source, r.problems, file=where, line=r.number)
                                   for r in chunk.refused)
                    if chunk.events.num_rows:
                        counter.add(chunk.events.num_rows)
                        yield from chunk.events.to_batches()
            except Exception as e:
                counter.error = e
                raise

        stream = batches()
        first = next(stream, None)  # a file of bad records only commits nothing to the master
        if first is None:
            self.ensure()
            version = self.latest_version()
        else:
            reader = pa.RecordBatchReader.from_batches(self.schema, itertools.chain([first], stream))
            version = self._append_counted(reader, counter, metadata)
        try:
            dead_letters.keep(letters)
        except Exception as e:
            raise DeadLetterWriteError(source.path, counter.events, version, letters, e) from e
        log.info("ingested %d events from %s at master version %d; %d bad record(s) kept as dead letters",
                 counter.events, source.path, version, len(letters))
        return IngestResult(counter.events, version, len(letters))

    def _validated_batches(self, source: SourceFile, counter: _Counter) -> Iterator[pa.RecordBatch]:
        """Yield validated chunks; after a bad chunk keep checking the rest, then raise (commit never happens)."""
        try:
            problems: list[EventProblem] = []
            for chunk in validated_chunks(source, self.pipeline.schema, chunk_rows=INGEST_CHUNK_LINES):
                if isinstance(chunk, EventValidationError):
                    problems.extend(chunk.problems)
                    continue
                if not problems:
                    counter.add(chunk.num_rows)
                    yield from chunk.to_batches()
            if problems:
                raise EventValidationError(problems, str(source.path))
        except Exception as e:
            counter.error = e
            raise


@dataclass
class _Counter:
    events: int = 0
    error: Exception | None = None
    on_rows: Callable[[int], None] | None = None

    def add(self, events: int) -> None:
        self.events += events
        if self.on_rows is not None:
            self.on_rows(events)


def dump_jsonl(events: list[dict[str, object]], file: Path) -> None:
    """Write events as JSON Lines (used by samples and tests)."""
    with file.open("w", encoding="utf-8") as fh:
        for event in events:
            fh.write(json.dumps(event, default=str) + "\n")
