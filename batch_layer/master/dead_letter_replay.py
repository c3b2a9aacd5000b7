"""Replaying dead letters: letters validated again with the pipeline's event model, the valid ones appended once.

After the event model or the data was fixed, :func:`replay` takes letters (rows of the dead-letter
table, ``DeadLetters.select``) and reads each one's raw text as one event:

* a JSON object (a Kafka record, a JSON line, a Parquet row), strictly, as JSON Lines ingest does;
* a CSV record (its letter holds the header line and the record, ``file_sorting``): cells coerced
  to the field types, as CSV ingest does.

An event without an event time takes the time the letter was refused (when it was first received,
near enough). Letters still invalid are reported with their problems and stay as they are; the
valid ones go to the master dataset in ONE commit that records one application transaction per
letter, ``("dead-letter:<id>", 0)``. A letter whose transaction is recorded already is skipped, so
replaying twice (or two replays racing: the loser's commit is refused and it decides again) appends
nothing twice. Letters are never deleted: a replayed letter stays in the table, and
:func:`replayed_ids` tells which are replayed. A ``transform`` letter is never replayed (reported as
still invalid, saying why): its event is in the master already, left out of the views only.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import pyarrow as pa

from batch_layer.master.dataset import MasterDataset
from batch_layer.master.storage import Appender, CommitConflictError
from shared_logic.errors import EventProblem, EventValidationError
from shared_logic.events import EventSchema

#: The application transaction id of a replayed letter (its app version is 0).
TRANSACTION_PREFIX = "dead-letter:"
#: Letters of this source are never replayed: their event is in the master already (the transform refused it).
NOT_REPLAYED = "transform"
_IN_THE_MASTER = ("a transform dead letter's event is in the master dataset already: fix the transform (or the "
                  "pipeline's data rule) and the next batch run counts it; replaying would append it twice")


@dataclass(frozen=True)
class ReplayResult:
    """What a replay did: letters appended now (at master ``version``), skipped as replayed before, and
    still invalid (id -> problems)."""

    replayed: list[str] = field(default_factory=list)
    already: list[str] = field(default_factory=list)
    invalid: dict[str, tuple[EventProblem, ...]] = field(default_factory=dict)
    version: int | None = None


def transaction_id(letter_id: str) -> str:
    return f"{TRANSACTION_PREFIX}{letter_id}"


def replayed_ids(master: MasterDataset, ids: Sequence[str]) -> set[str]:
    """Those of ``ids`` whose letter is in the master dataset already (its transaction is recorded)."""
    if not ids or master.engine.latest_version(master.path) is None:
        return set()
    appender = master.engine.appender(master.path)  # one handle for every look-up
    return {i for i in ids if appender.transaction_version(transaction_id(i)) is not None}


def replay(master: MasterDataset, letters: Sequence[Mapping[str, Any]]) -> ReplayResult:
    """Append the events of ``letters`` that are valid now, once each (see the module docstring)."""
    appender = master.appender()  # the table created, or evolved to the event model, first
    unique = list({str(letter["id"]): letter for letter in letters}.items())
    for _ in range(3):
        result = _replay_once(master, appender, unique)
        if result is not None:
            return result
        appender.refresh()  # another replay committed some of the same letters first: decide again
    raise CommitConflictError(f"replay into {master.path}: lost three commit races to concurrent replays; run it again")


def _replay_once(master: MasterDataset, appender: Appender,
                 letters: list[tuple[str, Mapping[str, Any]]]) -> ReplayResult | None:
    already = [i for i, _ in letters if appender.transaction_version(transaction_id(i)) is not None]
    done = set(already)
    events: list[pa.Table] = []
    ids: list[str] = []
    invalid: dict[str, tuple[EventProblem, ...]] = {}
    for letter_id, letter in letters:
        if letter_id in done:
            continue
        if letter.get("source") == NOT_REPLAYED:
            invalid[letter_id] = (EventProblem(f"letter {letter_id}", "(event)", _IN_THE_MASTER),)
            continue
        try:
            events.append(letter_events(master.pipeline.schema, letter))
            ids.append(letter_id)
        except EventValidationError as e:
            invalid[letter_id] = e.problems
    if not ids:
        return ReplayResult([], already, invalid, None)
    try:
        version = appender.append(pa.concat_tables(events), app_transactions=[(transaction_id(i), 0) for i in ids],
                                  metadata={"lambda.replay": f"{len(ids)} dead letter(s)"})
    except CommitConflictError:
        return None
    return ReplayResult(ids, already, invalid, version)


def letter_events(schema: EventSchema, letter: Mapping[str, Any]) -> pa.Table:
    """The event a letter's raw text holds, validated now (EventValidationError listing its problems)."""
    raw, where = str(letter.get("raw") or ""), f"dead letter {letter.get('id')}"
    # An event without its own time gets the time the ingest would have given it: a Kafka record's timestamp,
    # else the time it was refused (a file's line had only that).
    known = [t for t in (letter.get("record_time"), letter.get("dead_at")) if isinstance(t, datetime)]
    stamp = known[0] if known else datetime.now(timezone.utc)

    def clock() -> datetime:
        return stamp

    if not raw.lstrip().startswith("{") and letter.get("source") in ("file", "backfill") and "\n" in raw:
        return schema.validate_records([("the letter", _csv_values(raw, where))], source=where, strict=False,
                                       now=clock)
    return schema.validate_json_lines([(1, raw)], source=where, now=clock)


def _csv_values(raw: str, where: str) -> dict[str, str]:
    """The cells of a CSV letter (its header line, then one record), empty ones left out."""
    try:
        rows = [row for row in csv.reader(io.StringIO(raw), strict=True) if row]
    except csv.Error as e:
        raise EventValidationError([EventProblem("the letter", "(record)", f"not valid CSV: {e}")], where) from e
    if len(rows) != 2 or len(rows[0]) != len(rows[1]):
        raise EventValidationError([EventProblem("the letter", "(record)", "not one CSV record under its header "
                                                 "line (as CSV ingest keeps a bad record)")], where)
    return {column: cell for column, cell in zip(*rows) if cell != ""}
