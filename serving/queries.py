"""From an HTTP question to an exact answer: which fields to read, and how parts combine.

Values are combined only with each measure's monoid (``Measure.combine``); derived values
(averages) are computed from the combined parts, never stored or averaged again.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

from serving.errors import BadQueryError, NotFoundError
from serving.keys import encode_field
from serving.models import KeyAnswer, WindowSpan, WindowValue
from serving.store import Generation, KeyRead, ServingStore
from shared_logic.views import View

#: Most windows one range query may span (bounds the work of one atomic read).
MAX_WINDOWS = 2_000


def _utc(t: datetime) -> datetime:
    return t.replace(tzinfo=timezone.utc) if t.tzinfo is None else t.astimezone(timezone.utc)


def window_starts(view: View, window_start: datetime | None, start: datetime | None, end: datetime | None) -> list[int]:
    """Epoch-second window starts a query addresses; [] for an all-time view."""
    if view.window is None:
        if window_start or start or end:
            raise BadQueryError(f"view {view.name!r} has no window; drop window_start/from/to")
        return []
    size = view.window.seconds
    if window_start is not None:
        if start or end:
            raise BadQueryError("give either window_start or from/to, not both")
        return [view.window.start_of(_utc(window_start).timestamp())]
    if start is None or end is None:
        raise BadQueryError(
            f"view {view.name!r} is windowed ({size} s tumbling windows): give window_start=<time>, "
            "or from=<time>&to=<time> (ISO 8601 or epoch seconds)"
        )
    first, stop = view.window.start_of(_utc(start).timestamp()), _utc(end).timestamp()
    if stop <= first:
        raise BadQueryError(f"'to' ({end.isoformat()}) must be after 'from' ({start.isoformat()})")
    starts = list(range(first, int(stop) if stop == int(stop) else int(stop) + 1, size))
    starts = [s for s in starts if s < stop]
    if len(starts) > MAX_WINDOWS:
        raise BadQueryError(f"the range spans {len(starts)} windows; at most {MAX_WINDOWS} per query")
    return starts


def combine(view: View, parts: Sequence[dict[str, Any] | None]) -> dict[str, Any]:
    """Combine the scalar parts of several rows (windows, or batch and realtime) with each monoid."""
    merged: dict[str, Any] = {}
    for measure in view.scalar_measures:
        value = None
        for part in parts:
            if part is not None:
                value = measure.combine(value, part.get(measure.name))
        merged[measure.name] = value
    return merged


def _finish(view: View, scalars: dict[str, Any], distinct: dict[str, int]) -> dict[str, Any]:
    value = {**scalars, **distinct}
    value = {m.name: value.get(m.name) for m in view.measures}
    for derived in view.derived:
        value[derived.name] = derived.compute(value)
    return value


def _span(start: int, seconds: int) -> dict[str, datetime]:
    begin = datetime.fromtimestamp(start, tz=timezone.utc)
    return {"start": begin, "end": begin + timedelta(seconds=seconds)}


async def key_answer(
    store: ServingStore,
    view: View,
    key: str,
    *,
    window_start: datetime | None = None,
    start: datetime | None = None,
    end: datetime | None = None,
) -> KeyAnswer:
    """The exact measures of ``key`` in ``view`` (one window, a range of windows, or all time)."""
    starts = window_starts(view, window_start, start, end)
    fields = [encode_field(key, s) for s in starts] if starts else [encode_field(key)]
    read = await store.read(view.name, fields, [m.name for m in view.distinct_measures])
    if all(v is None for v in read.values):
        where = f" in the {len(starts)} window(s) asked for" if starts else ""
        raise NotFoundError(f"key {key!r} not found in view {view.name!r}{where} (generation {read.generation.generation})")
    value = _finish(view, combine(view, read.values), read.distinct_union)
    answer = _answer_base(view, key, read.generation, value)
    if view.window and window_start is not None:
        answer.window = WindowSpan(**_span(starts[0], view.window.seconds))
    elif view.window:
        answer.range = WindowSpan(start=_utc(start), end=_utc(end))  # type: ignore[arg-type]
        answer.windows = _per_window(view, starts, read)
    return answer


def _per_window(view: View, starts: list[int], read: KeyRead) -> list[WindowValue]:
    windows = []
    for i, (s, part) in enumerate(zip(starts, read.values)):
        if part is None:
            continue
        distinct = {m: (counts[i] if counts else read.distinct_union[m]) for m, counts in read.distinct_each.items()}
        windows.append(WindowValue(**_span(s, view.window.seconds), value=_finish(view, combine(view, [part]), distinct)))
    return windows


def _answer_base(view: View, key: str, generation: Generation, value: dict[str, Any]) -> KeyAnswer:
    computed = generation.computed_at
    return KeyAnswer(
        view=view.name,
        key=key,
        value=value,
        generation=generation.generation,
        version=generation.generation,
        computed_at=datetime.fromtimestamp(computed, tz=timezone.utc) if computed else None,
    )
