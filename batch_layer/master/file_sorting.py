"""An event file's records sorted into events and refused records: ingest with dead letters.

``file_formats.validated_chunks`` gives a chunk's events or its problems (all or nothing); here a
chunk gives both: the events of its valid records and, for each bad record, where it is, its
raw text and its problems. The same code validates as in ``validated_chunks`` (the pipeline's
``EventSchema``: JSON strictly, CSV text coerced, Parquet values strictly), so a record refused here
is one a plain ingest refuses too, with the same problems. A chunk with a bad record is validated
twice (the second time without its bad records); a valid chunk once.

A refused record's raw text: a JSON line as in the file (without its line end); a CSV record as
the header line and the record's lines as in the file (so it reads on its own, see
``dead_letter_replay``); a Parquet row as one JSON object of its values (times in ISO 8601).
Structural problems (a CSV header, a Parquet schema, text that is not UTF-8) are raised as in
``validated_chunks``: they are the file's, not a record's.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, TypeVar

import pyarrow as pa

from batch_layer.master.file_formats import SourceFile, csv_records, numbered_lines, parquet_records
from shared_logic.errors import EventProblem, EventValidationError
from shared_logic.events import EventSchema

_T = TypeVar("_T")


@dataclass(frozen=True)
class Refused:
    """One bad record of a file: its line (JSON Lines; CSV: the record's first line, the header being
    line 1) or row (Parquet), counted from 1, its raw text, and every problem it has."""

    number: int
    raw: str
    problems: tuple[EventProblem, ...]


@dataclass(frozen=True)
class SortedChunk:
    """A chunk of a file: the events of its valid records (master layout) and its refused records."""

    events: pa.Table
    refused: tuple[Refused, ...]


def sorted_chunks(source: SourceFile, schema: EventSchema, *, chunk_rows: int,
                  now: datetime | None = None) -> Iterator[SortedChunk]:
    """Each chunk of ``source``: its events and its refused records, in file order (see the module docstring).

    ``now``: the ingest time given to events without an event time (one for the whole file)."""
    stamp = now or datetime.now(timezone.utc)
    name = str(source.path)

    def clock() -> datetime:
        return stamp

    def records(items: Sequence[tuple[str, Any]], *, strict: bool) -> pa.Table:
        return schema.validate_records(items, source=name, strict=strict, now=clock)

    if source.format == "jsonl":
        for lines in numbered_lines(source.path, chunk_rows):
            yield _sort([(f"line {n}", (n, text)) for n, text in lines],
                        lambda items: schema.validate_json_lines(items, source=name, now=clock),
                        {f"line {n}": text.rstrip("\r\n") for n, text in lines})
    elif source.format == "csv":
        for pairs in csv_records(source.path, schema, chunk_rows, keep_text=True):
            unreadable = [Refused(_number(item.location), text or "", (item,))
                          for item, text in pairs if isinstance(item, EventProblem)]
            located = [(item[0], item) for item, _ in pairs if not isinstance(item, EventProblem)]
            texts = {item[0]: text or "" for item, text in pairs if not isinstance(item, EventProblem)}
            chunk = _sort(located, lambda items: records(items, strict=False), texts)
            yield SortedChunk(chunk.events, tuple(sorted((*chunk.refused, *unreadable), key=lambda r: r.number)))
    else:
        for rows in parquet_records(source.path, schema, chunk_rows):
            yield _sort([(location, (location, values)) for location, values in rows],
                        lambda items: records(items, strict=True),
                        {location: json.dumps(values, default=_json_value) for location, values in rows})


def _sort(items: list[tuple[str, _T]], validate: Callable[[list[_T]], pa.Table], raw: dict[str, str]) -> SortedChunk:
    """Validate ``items`` (location, record); on problems, set the records they name aside and validate
    the rest again (records are validated one by one, so the rest are valid)."""
    try:
        return SortedChunk(validate([record for _, record in items]), ())
    except EventValidationError as e:
        bad: dict[str, list[EventProblem]] = {}
        for problem in e.problems:
            bad.setdefault(problem.location, []).append(problem)
        events = validate([record for location, record in items if location not in bad])
        refused = (Refused(_number(location), raw[location], tuple(found)) for location, found in bad.items())
        return SortedChunk(events, tuple(sorted(refused, key=lambda r: r.number)))


def _number(location: str) -> int:
    """``line 7`` / ``row 12`` -> 7 / 12."""
    return int(location.split()[1])


def _json_value(value: object) -> object:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON")
