"""A key's session part made and kept: each event's part (``Measure.event_part``), a key's part over its events,
the JSON text gold rows and Redis rows hold, an answer's values, and the inputs a part can keep exactly.
Pure: no Spark, no I/O. The sessions and their merge are ``shared_logic.sessions``.

Times are integer microseconds since the epoch, never timestamps, so every accepted event time (years 1 to
9999) works whatever Spark's session time zone; a part's values are JSON values (an integer sum an exact
Python int, ``OVERFLOW`` only past 64 bits in an answer), which is why timestamp, date and decimal inputs are
refused where the rows' schema is known (``check_session_inputs``)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from shared_logic.errors import PipelineDefinitionError
from shared_logic.measures import OVERFLOW, Measure
from shared_logic.sessions import Folded, Part, Session, SessionWindow, fold, sessions_of

#: The range of a 64-bit integer: an integer sum past it answers ``OVERFLOW`` (``answer_values``).
INT64 = (-(2**63), 2**63 - 1)


def event_parts(measures: Sequence[Measure], row: Mapping[str, Any]) -> dict[str, Any]:
    """One event's part of each measure (``row``: its input columns' plain values): ``Measure.event_part``, so
    an integer sum stays an exact Python int and a measure's own part is its own."""
    return {m.name: m.event_part(None if m.column is None else _plain(row.get(m.column))) for m in measures}


def _plain(value: Any) -> Any:
    """A cell as a plain Python value (None for a missing one or a NaN)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return value.item() if hasattr(value, "item") else value


def part_of_events(window: SessionWindow, measures: Sequence[Measure],
                   events: Iterable[tuple[int, Mapping[str, Any]]]) -> Part:
    """A key's part over its events, each ``(time in microseconds since the epoch, its input columns)``: each
    event a one-event session, merged (``sessions_of``), folded past the bound. Times are integers, never
    timestamps: any accepted event time (years 1 to 9999) works, whatever Spark's session time zone."""
    parts = ((t, event_parts(measures, row)) for t, row in events)
    folded, kept = fold(measures, Folded(), sessions_of(window.gap_micros, measures, parts), window.max_sessions)
    return Part(kept, folded)


def answer_values(measures: Sequence[Measure], parts: Mapping[str, Any]) -> dict[str, Any]:
    """Each measure's answer from its part (combined with the identity, as every answer is); an integer part
    beyond 64 bits (an integer sum kept exactly) answers ``OVERFLOW``, as a measure view's long sum does."""
    values = {m.name: m.combine(parts.get(m.name), None) for m in measures}
    return {k: OVERFLOW if isinstance(v, int) and not INT64[0] <= v <= INT64[1] else v for k, v in values.items()}


def encode_part(measures: Sequence[Measure], part: Part) -> str:
    """A part as the JSON text gold rows and Redis rows keep: ``{"s": [[start, end, [measures...]]...],
    "f": null or [sessions, total, longest, start, end, [measures...]]}`` (measures in the view's order;
    an overflowed sum as the string ``"overflow"``)."""
    def values(parts: Mapping[str, Any]) -> list[Any]:
        return [_finite(parts.get(m.name)) for m in measures]
    f = part.folded
    folded = None if not f.sessions else [f.sessions, f.total_duration, f.longest, f.start, f.end, values(f.parts)]
    return json.dumps({"s": [[s.start, s.end, values(s.parts)] for s in part.sessions], "f": folded},
                      separators=(",", ":"))


def _finite(value: Any) -> Any:
    return "overflow" if isinstance(value, float) and not math.isfinite(value) else value


def decode_part(measures: Sequence[Measure], text: str | bytes | None) -> Part:
    """``encode_part`` undone; no text (a key without a row) is the empty part."""
    if not text:
        return Part()
    raw = json.loads(text)
    names = [m.name for m in measures]
    sessions = tuple(Session(s, e, dict(zip(names, v))) for s, e, v in raw["s"])
    f = raw.get("f")
    folded = Folded() if not f else Folded(f[0], f[1], f[2], f[3], f[4], dict(zip(names, f[5])))
    return Part(sessions, folded)


def row_bytes(window: SessionWindow, measures: Sequence[Measure]) -> int:
    """About the most bytes a key's encoded part takes (``encode_part``): ``max_sessions`` sessions of two times
    and a number per measure (a long string in a min or max makes it more)."""
    return (window.max_sessions + 1) * (40 + 24 * len(measures))


def check_session_inputs(view: str, window: SessionWindow, measures: Sequence[Measure], types: Mapping[str, str]) -> None:
    """The columns a session view reads, by their Spark types (``types``: name -> ``simpleString()``): the time
    column a timestamp, each measure's input one its ``event_inputs`` takes (a session part is JSON: a
    timestamp, date or decimal would not come back exactly). Called where the rows' schema is known
    (``View.aggregate``, in both layers, before any row is read)."""
    if types.get(window.time_column) != "timestamp":
        raise PipelineDefinitionError(
            f"view {view!r}: its session time column {window.time_column!r} is {types.get(window.time_column)}, not a "
            "timestamp; make the pipeline's transform produce a timestamp column (UTC) or name another in "
            "SessionWindow(time_column=...)")
    for m in measures:
        kind = types.get(m.column or "")
        if m.column is not None and m.event_inputs is not None and kind not in m.event_inputs:
            raise PipelineDefinitionError(
                f"view {view!r}: measure {m.name!r} reads {m.column!r} of type {kind}, which a session view cannot "
                f"keep exactly (its parts are JSON; it takes {', '.join(sorted(m.event_inputs))}); derive such a "
                f"column in the pipeline's transform (for a time: F.unix_micros({m.column!r}); session_start and "
                "session_end already give a session's first and last event time), or use a windowed view")
