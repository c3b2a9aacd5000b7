"""Poison events in a batch run: its views leave them out, and it keeps them as dead letters.

The rule is ``shared_logic.poison``'s, the speed layer's too. A run computes its views from the
snapshot's events (``Screen``); when a view's query fails on a poison event it finds the poison
events (``isolate``) and computes from the others, so a poison event never fails a run, and the
views are the same the speed layer gives for the same events.

The batch layer is the one that keeps transform dead letters (the speed layer only leaves the events
out and counts them in its heartbeat): each run covers every event up to its barrier, so it sees
every poison event. A run keeps the letters not kept yet (``record``): a letter's id is the event's
text and which copy of it this is (identical events are one letter per copy), so a later run, which
finds the same poison events again, keeps only new ones, and the write records the application
transaction (``APP_ID``, the generation): a repeat of it keeps nothing.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from datetime import date, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any, TypeVar

from batch_layer.master.dead_letters import DeadLetter, DeadLetterConfig, DeadLetters
from shared_logic.poison import PoisonEvent, data_error, isolate, view_rows, without

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from shared_logic.pipeline import Pipeline

log = logging.getLogger(__name__)

#: The application transaction of a run's transform dead letters (its version: the generation).
APP_ID = "lambda-batch-transform"
T = TypeVar("T")


class Screen:
    """The snapshot's events as the views read them: every event, until a view's query fails on poison
    events; from then on the others (``poison`` holds what was left out)."""

    def __init__(self, pipeline: Pipeline, events: DataFrame) -> None:
        self.pipeline, self.events = pipeline, events
        self.poison: list[PoisonEvent] = []
        self._clean = events

    def rows(self) -> DataFrame:
        """The transformed, checked rows of the events kept (``shared_logic.poison.view_rows``)."""
        return view_rows(self.pipeline, self._clean)

    @property
    def left_out(self) -> int:
        """Events left out, every copy counted."""
        return sum(p.copies for p in self.poison)

    def compute(self, query: Callable[[DataFrame], T]) -> T:
        """``query(rows)``; if it fails on a poison event, the poison events are found and it runs again
        without them. Any other failure, or a second one after the search, is raised (a transform that
        fails on an event only beside others breaks the pipeline contract)."""
        failure = None
        try:
            return query(self.rows())
        except Exception as e:  # Spark raises many classes: data_error tells poison from the rest
            failure = data_error(e)
            if failure is None or self._clean is not self.events:
                raise
        assert failure is not None
        log.warning("a view's query failed on an event's data (%s: %s); finding the poison events",
                    failure.condition, failure.message[:300])
        self.poison = isolate(self.pipeline, self.events, failure=failure)
        self._clean = without(self.events, self.poison)
        log.warning("%d poison event(s) left out of the views (%d distinct): %s", self.left_out, len(self.poison),
                    "; ".join(f"{p.condition}: {p.reason[:120]}" for p in self.poison[:5]))
        return query(self.rows())


def letters(poison: Sequence[PoisonEvent], master: str) -> list[DeadLetter]:
    """One letter per copy of each poison event: its columns as a JSON object, source 'transform', ``file``
    the master dataset and ``line`` the copy's number (1 for the first), the measure input at fault."""
    return [
        DeadLetter(raw=_event_json(p.event), source="transform", reason=f"{p.condition}: {p.reason}",
                   field=p.field, file=master, line=copy)
        for p in poison for copy in range(1, p.copies + 1)
    ]


def record(config: DeadLetterConfig, pipeline: str, poison: Sequence[PoisonEvent], *, master: str,
           generation: int) -> int:
    """Keep the letters of ``poison`` not kept yet, in one commit of transaction (``APP_ID``, ``generation``);
    returns how many were kept. Best effort: a failure is logged, never the run's (dead letters must not
    become a second way to stop)."""
    try:
        table = DeadLetters.open(config, pipeline)
        candidates = letters(poison, master)
        kept = {str(row["id"]) for row in table.select(ids=[letter.id for letter in candidates])}
        new = [letter for letter in candidates if letter.id not in kept]
        if new and table.append(new, app_id=APP_ID, app_version=generation) is not None:
            return len(new)
    except Exception as e:  # the table's engines raise several kinds
        log.warning("poison events of pipeline %s not kept as dead letters (the next run tries again): %s",
                    pipeline, e)
    return 0


def _event_json(event: dict[str, Any]) -> str:
    """An event's columns as one JSON object, as an event line holds it (times in ISO 8601)."""
    return json.dumps(event, default=_json_value, ensure_ascii=False)


def _json_value(value: object) -> object:
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, (bytes, bytearray)):
        return value.decode("utf-8", errors="backslashreplace")
    return str(value)
