"""Event files the master dataset ingests: JSON Lines, CSV and Parquet, read chunk by chunk.

Guarantees:

* A file's format comes from its extension (:data:`EXTENSIONS`) unless named; a folder stands for
  its files with an accepted extension, sorted by name (not recursive; hidden files skipped). Every
  path that names nothing to ingest (missing, a folder without event files, an unknown extension) is
  reported in one SourceFilesError (an IngestError) naming each path and its problem.
* :func:`check` reads only a file's header (CSV) or footer (Parquet): the columns must be fields of
  the event model (an unknown column is an error, as an unknown JSON field is), every required
  field must have a column, and Parquet column types must be readable as the field's type. Its
  problems are EventValidationError located at ``line 1`` (CSV) or ``schema`` (Parquet).
* :func:`validated_chunks` yields each chunk's events in master layout, or its problems, so the
  caller can check a whole file and write nothing of it when any chunk failed. Every chunk goes
  through the pipeline's ``EventSchema``: JSON strictly (``validate_json_lines``), CSV text coerced
  to the field types, Parquet values strictly (``validate_records``). Memory is bounded by the
  chunk size.  ``file_sorting`` reads through the same functions to keep the valid records of a chunk and set
  the bad ones aside (ingest with dead letters).
* CSV: the first line is the header; problems name the record's first line (1-based, the header
  is line 1) and the field. An empty cell is an absent field (its default, or "Field required").
  Blank lines are skipped. Parquet: problems name the row (1-based, in file order). Timestamps of
  any unit are read as microseconds in UTC (a naive one is taken as UTC).
"""

from __future__ import annotations

import csv
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeAlias

import pyarrow as pa
import pyarrow.parquet as pq

from batch_layer.errors import IngestError, SourceFilesError
from shared_logic.errors import EventProblem, EventValidationError
from shared_logic.events import EventSchema

#: Accepted file extensions and the format each means.
EXTENSIONS: dict[str, str] = {".parquet": "parquet", ".csv": "csv", ".jsonl": "jsonl", ".json": "jsonl"}
#: The formats, as ``--format`` names them.
FORMATS: tuple[str, ...] = ("jsonl", "csv", "parquet")

#: What one chunk of a file is: its validated events, or every problem it has.
Chunk: TypeAlias = "pa.Table | EventValidationError"


@dataclass(frozen=True)
class SourceFile:
    """One file to ingest and its format (one of :data:`FORMATS`)."""

    path: Path
    format: str


def source_files(paths: Sequence[Path], file_format: str | None = None) -> list[SourceFile]:
    """The files ``paths`` name, in order, each folder expanded (see the module docstring).

    Raises SourceFilesError, before anything is read, naming every missing path, empty folder and
    unknown extension among ``paths`` (not only the first).
    """
    found, problems = resolve_sources(paths, file_format)
    if problems:
        raise SourceFilesError(problems)
    return found


def resolve_sources(paths: Sequence[Path], file_format: str | None = None) -> tuple[list[SourceFile],
                                                                                   list[tuple[str, str]]]:
    """The files ``paths`` name, in order, each folder expanded, and a (path, problem) pair for each path
    that names nothing to ingest (missing, a folder without event files, an unknown extension)."""
    if file_format is not None and file_format not in FORMATS:
        raise IngestError(f"unknown format {file_format!r}; the formats are {', '.join(FORMATS)}")
    wanted = [e for e, f in EXTENSIONS.items() if file_format in (None, f)]
    found: list[SourceFile] = []
    problems: list[tuple[str, str]] = []
    for path in paths:
        if path.is_dir():
            files = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith((".", "_"))
                           and p.suffix.lower() in wanted)
            if not files:
                problems.append((str(path), f"the folder holds no {', '.join(wanted)} files"))
            found.extend(SourceFile(p, file_format or EXTENSIONS[p.suffix.lower()]) for p in files)
        elif path.is_file():
            if file_format is None and path.suffix.lower() not in EXTENSIONS:
                problems.append((str(path), f"unknown extension {path.suffix or '(none)'!r}; the accepted extensions "
                                            f"are {', '.join(EXTENSIONS)} (or name the format)"))
            else:
                found.append(SourceFile(path, file_format or EXTENSIONS[path.suffix.lower()]))
        else:
            problems.append((str(path), "no such file"))
    return found, problems


def check(source: SourceFile, schema: EventSchema) -> None:
    """Check what can be checked cheaply (CSV header, Parquet schema); raises EventValidationError or IngestError."""
    if source.format == "csv":
        try:
            with _open_text(source.path) as fh:
                header = next(csv.reader(fh), [])
        except (UnicodeDecodeError, csv.Error) as e:
            why = f"not UTF-8 text ({e.reason} at byte {e.start})" if isinstance(e, UnicodeDecodeError) else \
                f"its header is not valid CSV: {e}"
            raise IngestError(f"cannot ingest {source.path}: {why}") from e
        _csv_header(header, schema, str(source.path))
    elif source.format == "parquet":
        _parquet_columns(_parquet_file(source.path).schema_arrow, schema, str(source.path))


def validated_chunks(source: SourceFile, schema: EventSchema, *, chunk_rows: int,
                     now: datetime | None = None) -> Iterator[Chunk]:
    """Each chunk of ``source`` validated: its events (master layout) or its problems.

    A structural problem (header, column types, encoding) is raised, not yielded. ``now``: the ingest
    time given to events without an event time (one for the whole file; default: when called).
    """
    stamp = now or datetime.now(timezone.utc)
    name = str(source.path)

    def validate(records: Sequence[Record], *, strict: bool) -> Chunk:
        try:
            return schema.validate_records(records, source=name, strict=strict, now=lambda: stamp)
        except EventValidationError as e:
            return e

    if source.format == "jsonl":
        for lines in numbered_lines(source.path, chunk_rows):
            try:
                yield schema.validate_json_lines(lines, source=name, now=lambda: stamp)
            except EventValidationError as e:
                yield e
    elif source.format == "csv":
        for pairs in csv_records(source.path, schema, chunk_rows):
            items = [item for item, _ in pairs]
            chunk = validate([r for r in items if not isinstance(r, EventProblem)], strict=False)
            unparsed = [p for p in items if isinstance(p, EventProblem)]
            if unparsed:
                found = [*unparsed, *(chunk.problems if isinstance(chunk, EventValidationError) else ())]
                chunk = EventValidationError(sorted(found, key=lambda p: int(p.location.split()[1])), name)
            yield chunk
    else:
        for records in parquet_records(source.path, schema, chunk_rows):
            yield validate(records, strict=True)


def numbered_lines(file: Path, chunk_lines: int) -> Iterator[list[tuple[int, str]]]:
    """Chunks of (line number, text) for the non-blank lines of ``file``."""
    chunk: list[tuple[int, str]] = []
    try:
        with file.open("r", encoding="utf-8") as fh:
            for number, line in enumerate(fh, start=1):
                if line.strip():
                    chunk.append((number, line))
                if len(chunk) >= chunk_lines:
                    yield chunk
                    chunk = []
    except UnicodeDecodeError as e:
        raise IngestError(f"cannot ingest {file}: not UTF-8 text ({e.reason} at byte {e.start})") from e
    if chunk:
        yield chunk


# -- CSV ---------------------------------------------------------------------------------------

Record = tuple[str, dict[str, Any]]


def _open_text(file: Path) -> Any:
    return file.open("r", encoding="utf-8-sig", newline="")  # a byte-order mark (spreadsheet exports) is not text


def _csv_header(header: list[str], schema: EventSchema, source: str) -> list[str]:
    """The header's column names, or EventValidationError naming each unknown, repeated or missing column."""
    problems = [EventProblem("line 1", c, "unknown column: not a field of the event model")
                for c in header if c not in schema.fields]
    problems += [EventProblem("line 1", c, "repeated column") for c in sorted({c for c in header if header.count(c) > 1})]
    problems += [EventProblem("line 1", c, "required field has no column") for c in _required(schema) if c not in header]
    if not header:
        problems = [EventProblem("line 1", "(header)", "no header line: the first line must name the columns")]
    if problems:
        raise EventValidationError(problems, source)
    return header


def _required(schema: EventSchema) -> list[str]:
    return [n for n, f in schema.model.model_fields.items() if f.is_required()]


def csv_records(file: Path, schema: EventSchema, chunk_rows: int, *, keep_text: bool = False
                ) -> Iterator[list[tuple[Record | EventProblem, str | None]]]:
    """Chunks of (``line N``, {column: cell}) with empty cells left out, N the record's first line, or of the
    problem of a record that is not a row of the header's columns; each with, when ``keep_text``, the text
    of the header line and of the record's lines as in the file (a record readable on its own), else None."""
    lines: list[str] = []

    def recorded(fh: Any) -> Iterator[str]:
        for line in fh:
            lines.append(line)
            yield line

    try:
        with _open_text(file) as fh:
            reader = csv.reader(recorded(fh) if keep_text else fh, strict=True)
            header = _csv_header(next(reader, []), schema, str(file))
            head = "".join(lines)
            chunk: list[tuple[Record | EventProblem, str | None]] = []
            end = reader.line_num
            while True:
                start = end + 1
                problem: EventProblem | None = None
                lines.clear()
                try:
                    row = next(reader, None)
                except csv.Error as e:
                    row, problem = [], EventProblem(f"line {start}", "(record)", f"not valid CSV: {e}")
                end = reader.line_num
                if row is None:
                    break
                if row and len(row) != len(header):
                    problem = EventProblem(f"line {start}", "(record)",
                                           f"has {len(row)} cells, the header has {len(header)}")
                text = (head + "".join(lines)).rstrip("\r\n") if keep_text else None
                if problem is not None:
                    chunk.append((problem, text))
                elif row:  # else a blank line
                    chunk.append(((f"line {start}", {c: v for c, v in zip(header, row) if v != ""}), text))
                if len(chunk) >= chunk_rows:
                    yield chunk
                    chunk = []
            if chunk:
                yield chunk
    except UnicodeDecodeError as e:
        raise IngestError(f"cannot ingest {file}: not UTF-8 text ({e.reason} at byte {e.start})") from e


# -- Parquet -----------------------------------------------------------------------------------

def _parquet_file(file: Path) -> pq.ParquetFile:
    try:
        return pq.ParquetFile(file)
    except (pa.ArrowInvalid, OSError) as e:
        raise IngestError(f"cannot ingest {file}: not a Parquet file ({e})") from e


def _readable(column: pa.DataType, field: pa.DataType) -> bool:
    """Whether ``column``'s values can be read as the event field's type without changing them."""
    if pa.types.is_dictionary(column):
        column = column.value_type
    if pa.types.is_string(field):
        return pa.types.is_string(column) or pa.types.is_large_string(column) or pa.types.is_string_view(column)
    if pa.types.is_integer(field):
        return pa.types.is_integer(column)  # a uint64 beyond the int64 range is a row problem
    if pa.types.is_floating(field):
        return pa.types.is_floating(column) or pa.types.is_integer(column)
    if pa.types.is_boolean(field):
        return pa.types.is_boolean(column)
    return pa.types.is_timestamp(column)


def _parquet_columns(columns: pa.Schema, schema: EventSchema, source: str) -> list[str]:
    """The file's column names, or EventValidationError naming each unknown, missing or mistyped column."""
    master = schema.arrow_schema()
    problems = []
    for column in columns:
        if column.name not in schema.fields:
            problems.append(EventProblem("schema", column.name, "unknown column: not a field of the event model"))
        elif not _readable(column.type, master.field(column.name).type):
            problems.append(EventProblem("schema", column.name, f"column type {column.type} cannot be read as "
                                                                f"{master.field(column.name).type}"))
    problems += [EventProblem("schema", c, "required field has no column") for c in _required(schema)
                 if c not in columns.names]
    if problems:
        raise EventValidationError(problems, source)
    return columns.names


def parquet_records(file: Path, schema: EventSchema, chunk_rows: int, *, row_groups: Sequence[int] | None = None,
                     first_row: int = 0) -> Iterator[list[Record]]:
    """Chunks of (``row N``, {column: value}), N counted from 1 in file order; ``row_groups``: only
    those (consecutive, the first starting at row ``first_row`` from 0)."""
    parquet = _parquet_file(file)
    names = _parquet_columns(parquet.schema_arrow, schema, str(file))
    utc = pa.timestamp("us", tz="UTC")
    row = first_row
    for batch in parquet.iter_batches(batch_size=chunk_rows, row_groups=row_groups, columns=names):
        columns: dict[str, list[Any]] = {}
        for name, values in zip(batch.schema.names, batch.columns):
            if pa.types.is_timestamp(values.type):
                try:
                    values = values.cast(pa.timestamp(values.type.unit, tz=values.type.tz or "UTC")).cast(utc)
                except pa.ArrowInvalid as e:
                    raise EventValidationError([EventProblem("schema", name, f"not readable in microseconds: {e}")],
                                               str(file)) from e
            columns[name] = values.to_pylist()
        rows = [{n: columns[n][i] for n in names} for i in range(batch.num_rows)]
        yield [(f"row {row + i + 1}", r) for i, r in enumerate(rows)]
        row += batch.num_rows


def parquet_row_groups(file: Path, schema: EventSchema) -> list[tuple[int, int]]:
    """(row group, its first row from 0) of each row group of ``file``, after checking its schema (as :func:`check`)."""
    parquet = _parquet_file(file)
    _parquet_columns(parquet.schema_arrow, schema, str(file))
    groups, first = [], 0
    for i in range(parquet.metadata.num_row_groups):
        groups.append((i, first))
        first += parquet.metadata.row_group(i).num_rows
    return groups


def validated_row_group(file: Path, schema: EventSchema, row_group: int, first_row: int, *, chunk_rows: int,
                        now: datetime) -> Iterator[Chunk]:
    """As :func:`validated_chunks` for one row group of a Parquet file (Spark validates row groups in parallel)."""
    for records in parquet_records(file, schema, chunk_rows, row_groups=[row_group], first_row=first_row):
        try:
            yield schema.validate_records(records, source=str(file), strict=True, now=lambda: now)
        except EventValidationError as e:
            yield e
