"""From an HTTP question to an exact answer: which parts to read, and how they combine.

Batch and realtime parts, and the parts of several windows, are combined only with each
measure's monoid (``Measure.combine``); derived values (averages) are computed from the combined
parts, never stored or averaged again.

A sum whose parts overflowed (``shared_logic.measures``) answers ``"overflow"`` (``OVERFLOW``), and so
does an average of it: in JSON, in CSV and NDJSON exports alike; a top-N leaves such keys out of its
ranking (their value is no number to rank by).
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from serving.api.errors import BadQueryError, NotFoundError
from serving.api.models import Explanation, KeyAnswer, TopAnswer, TopEntry, WindowSpan, WindowValue
from serving.api.times import at, epoch_seconds
from serving.store.reader import ServingStore
from serving.store.reads import Generation, KeyRead
from shared_logic.event_values import echo
from shared_logic.events import TIME_MAX, TIME_MIN, TIME_RANGE
from shared_logic.measures import OVERFLOW, Count, Measure, overflowed
from shared_logic.views import View

#: Most windows one range query may span (bounds the work of one atomic read).
MAX_WINDOWS = 2_000
#: Longest key, ``prefix`` or key column filter a query takes, in characters (422 above; the routes
#: declare it as ``maxLength``). With the cursor's and the times' limits it keeps every request the
#: document allows (each character percent-encoded as up to 12 bytes) within the 65535 bytes of URL
#: the HTTP server reads, so each gets this API's answer; and the cursor after any such key fits
#: ``key_pages.MAX_CURSOR_CHARS``.
MAX_KEY_CHARS = 2048
#: Epoch seconds a window addressed by a query must lie in: its start at or after TIME_MIN and its
#: end (exclusive, itself an answer's time) at or before TIME_MAX, rounded down to a second.
_FIRST, _LAST = epoch_seconds(TIME_MIN), epoch_seconds(TIME_MAX)
_MICROSECOND = timedelta(microseconds=1)


@functools.lru_cache(maxsize=64)
def _at(epoch: float | None) -> datetime | None:
    """A generation's ``computed_at`` as a datetime (cached: every answer from a generation names it)."""
    return None if epoch is None else at(0) + timedelta(seconds=epoch)


def _outside(view: View, param: str, t: datetime) -> BadQueryError:
    size = view.window.seconds  # type: ignore[union-attr]
    earliest, latest = -(-_FIRST // size) * size, (_LAST - size) // size * size + size
    return BadQueryError(
        f"{param}: the {size} s window of view {view.name!r} holding {t.isoformat()} reaches outside the supported "
        f"time range {TIME_RANGE}; for this view give a time from {at(earliest).isoformat()} to "
        f"{(at(latest) - _MICROSECOND).isoformat()}"
    )


def _window_of(view: View, param: str, t: datetime) -> int:
    """Start (epoch seconds) of the window of ``view`` holding ``t``, which must lie in the supported range."""
    size = view.window.seconds  # type: ignore[union-attr]
    start = view.window.start_of(epoch_seconds(t))  # type: ignore[union-attr]
    if start < _FIRST or start + size > _LAST:
        raise _outside(view, param, t)
    return start


def window_starts(view: View, window_start: datetime | None, start: datetime | None, end: datetime | None) -> list[int]:
    """Epoch-second window starts a query addresses; [] for an all-time view. Times are aware UTC
    datetimes (``serving.api.times``); arithmetic is exact, in whole seconds and microseconds."""
    if view.window is None:
        if window_start or start or end:
            raise BadQueryError(f"view {view.name!r} has no window; drop window_start/from/to")
        return []
    size = view.window.seconds
    if window_start is not None:
        if start or end:
            raise BadQueryError("give either window_start or from/to, not both")
        return [_window_of(view, "window_start", window_start)]
    if start is None or end is None:
        raise BadQueryError(
            f"view {view.name!r} is windowed ({size} s tumbling windows): give window_start=<time>, "
            "or from=<time>&to=<time> (ISO 8601 or epoch seconds)"
        )
    if end <= start:
        raise BadQueryError(f"'to' ({end.isoformat()}) must be after 'from' ({start.isoformat()})")
    first = _window_of(view, "from", start)
    count = -(-(end - at(first)) // timedelta(seconds=size))
    if count > MAX_WINDOWS:
        raise BadQueryError(f"the range spans {count} windows; at most {MAX_WINDOWS} per query")
    if first + count * size > _LAST:
        raise _outside(view, "to", end - _MICROSECOND)
    return [first + i * size for i in range(count)]


# --------------------------------------------------------------------------------------------
# what a view's answers need, derived once per view


@dataclass(frozen=True)
class _Shape:
    """A view's measures as its answers use them (``View`` derives these anew on every access)."""

    scalar: tuple[Measure, ...]
    scalar_names: tuple[str, ...]
    distinct_names: tuple[str, ...]
    counts: tuple[str, ...]
    #: (name, measure) of each scalar measure, and every measure's name in the view's order.
    named: tuple[tuple[str, Measure], ...]
    names: tuple[str, ...]


#: id(view) -> (view, its shape); the view is kept so that its id is never reused for another view.
_SHAPES: dict[int, tuple[View, _Shape]] = {}


def _shape(view: View) -> _Shape:
    entry = _SHAPES.get(id(view))
    if entry is None or entry[0] is not view:
        scalar = view.scalar_measures
        shape = _Shape(scalar, tuple(m.name for m in scalar), tuple(m.name for m in view.distinct_measures),
                       tuple(m.name for m in scalar if isinstance(m, Count)), tuple((m.name, m) for m in scalar),
                       tuple(m.name for m in view.measures))
        if len(_SHAPES) > 1024:  # pipelines are loaded once per app; tests build many
            _SHAPES.clear()
        _SHAPES[id(view)] = entry = (view, shape)
    return entry[1]


# --------------------------------------------------------------------------------------------
# integral measures

_INTEGRAL: weakref.WeakKeyDictionary[ServingStore, dict[tuple[int, str], frozenset[str]]] = weakref.WeakKeyDictionary()


async def integral_measures(store: ServingStore, generation: int, view: View) -> frozenset[str]:
    """The measures of ``view`` whose values are integers in ``generation``: what the batch run recorded
    (in the generation's record, ``GenerationMeta.integral``: measures over an integral column type), else
    the counts. Cached per store and generation (a generation's metadata never changes)."""
    found = _known_integral(store, generation, view)
    if found is None:
        recorded = await store.integral_measures(generation, view.name)
        found = frozenset(_shape(view).counts if recorded is None else recorded)
        cache = _INTEGRAL.setdefault(store, {})
        if len(cache) > 256:  # generations come and go: keep the cache small
            cache.clear()
        cache[(generation, view.name)] = found
    return found


def _known_integral(store: ServingStore, generation: int, view: View) -> frozenset[str] | None:
    cache = _INTEGRAL.get(store)
    return None if cache is None else cache.get((generation, view.name))


def _typed(name: str, value: Any, integral: frozenset[str]) -> Any:
    """Measure ``name``'s value as an int when it is integral (parts arrive as floats; exact below 2**53);
    ``OVERFLOW`` for an overflowed sum."""
    if overflowed(value):
        return OVERFLOW
    return int(value) if value is not None and name in integral else value


def combine(view: View, parts: Iterable[dict[str, float | None]], integral: frozenset[str] = frozenset()) -> dict[str, Any]:
    """Combine scalar parts (windows; batch and realtime) with each measure's monoid."""
    named = _shape(view).named
    merged: dict[str, Any] = dict.fromkeys(name for name, _ in named)
    for part in parts:
        for name, measure in named:
            merged[name] = measure.combine(merged[name], part.get(name))
    return {name: _typed(name, value, integral) for name, value in merged.items()}


def _finish(view: View, scalars: dict[str, Any], distinct: dict[str, int]) -> dict[str, Any]:
    parts = {**scalars, **distinct}
    value = {name: parts.get(name) for name in _shape(view).names}
    for derived in view.derived:
        value[derived.name] = derived.compute(value)
    return value


def _present(part: dict[str, float | None]) -> bool:
    return any(v is not None for v in part.values())


async def read_items(store: ServingStore, view: View, items: list[tuple[str, int | None]]) -> KeyRead:
    """Every measure's parts of ``items`` (key, window start) of ``view``, all in one bucket, in one atomic read."""
    shape = _shape(view)
    return await store.read(view.name, items, shape.scalar_names, shape.distinct_names)


def _held(read: KeyRead, i: int) -> bool:
    """Whether item ``i`` has a row in the batch or realtime part: a scalar value, or distinct values (a view
    of distinct measures only has no scalar to tell)."""
    return (_present(read.batch[i]) or _present(read.realtime[i])
            or any(n > 0 for n in read.distinct_merged[i].values()))


def row_value(view: View, read: KeyRead, i: int, integral: frozenset[str]) -> dict[str, Any] | None:
    """Item ``i`` of ``read`` (one key in one window, or all time) as an answer's value: its batch and
    realtime parts combined, its merged distinct counts; None when neither part holds the row."""
    if not _held(read, i):
        return None
    return _finish(view, combine(view, [read.batch[i], read.realtime[i]], integral), read.distinct_merged[i])


def span(start: int, seconds: int) -> dict[str, datetime]:
    return {"start": at(start), "end": at(start + seconds)}


async def key_answer(
    store: ServingStore,
    view: View,
    key: str,
    *,
    window_start: datetime | None = None,
    start: datetime | None = None,
    end: datetime | None = None,
    explain: bool = False,
) -> KeyAnswer:
    """The exact measures of ``key`` in ``view`` (one window, a range of windows, or all time)."""
    starts = window_starts(view, window_start, start, end)
    items = [(key, s) for s in starts] if starts else [(key, None)]
    shape = _shape(view)
    read = await store.read(view.name, items, shape.scalar_names, shape.distinct_names)
    present = [_held(read, i) for i in range(len(items))]
    if not any(present):
        where = f" in the {len(starts)} window(s) asked for" if starts else ""
        raise NotFoundError(f"key {echo(key)} not found in view {view.name!r}{where} "
                            f"(as of master version {read.generation.version})")
    served = read.generation.generation
    integral = _known_integral(store, served, view)
    if integral is None:
        integral = await integral_measures(store, served, view)
    value = _finish(view, combine(view, [*read.batch, *read.realtime], integral), read.distinct_total)
    answer = _answer(view, key, read.generation, value)
    if view.window and window_start is not None:
        answer.window = WindowSpan(**span(starts[0], view.window.seconds))
    elif view.window:
        answer.range = WindowSpan(start=start, end=end)  # type: ignore[arg-type]
        answer.windows = [
            WindowValue(**span(s, view.window.seconds), value=row_value(view, read, i, integral) or {})
            for i, s in enumerate(starts) if present[i]
        ]
    if explain:
        answer.explain = _explain(view, read, integral)
    return answer


def _explain(view: View, read: KeyRead, integral: frozenset[str]) -> Explanation:
    def side(scalars: list[dict[str, float | None]], distinct: list[dict[str, int]]) -> dict[str, Any]:
        merged = combine(view, scalars, integral)
        if len(distinct) == 1:
            merged.update(distinct[0])
        return merged

    served = read.generation
    return Explanation(
        batch=side(read.batch, read.distinct_batch),
        realtime=side(read.realtime, read.distinct_realtime),
        generation=served.generation,
        generation_version=served.generation,
        speed_processed_version=served.processed,
        computed_at=_at(served.computed_at),
    )


def _ranking(view: View, name: str) -> Measure:
    """The scalar measure ``name`` of ``view``, or a 422 naming the ones a top-N ranks by."""
    for measure in view.scalar_measures:
        if measure.name == name:
            return measure
    names = [m.name for m in view.scalar_measures]
    what = ("is empty" if not name else "is a distinct count" if name in {m.name for m in view.distinct_measures}
            else f"is not a measure of view {view.name!r}")
    raise BadQueryError(f"measure: {echo(name)} {what}; top-N ranks by one of {names} (leave measure out for "
                        f"{names[0]!r})")


def _answer(view: View, key: str, served: Generation, value: dict[str, Any]) -> KeyAnswer:
    return KeyAnswer(
        view=view.name, key=key, value=value, generation=served.generation, version=served.version,
        computed_at=_at(served.computed_at), logic=served.logic or None,
    )


async def top_answer(
    store: ServingStore, view: View, measure_name: str | None, n: int, window_start: datetime | None
) -> TopAnswer:
    """The exact top ``n`` keys of ``view`` by a scalar measure of the merged values (ties: key order), of the
    keys whose value is a number (an overflowed sum is not ranked). No ``measure_name``: the view's first
    scalar measure; one the view lacks (or empty) is a 422 naming them."""
    measure = view.scalar_measures[0] if measure_name is None else _ranking(view, measure_name)
    starts = window_starts(view, window_start, None, None)
    read = await store.top(view.name, measure.name, starts[0] if starts else None, n, measure.combines)
    integral = await integral_measures(store, read.generation.generation, view)
    merged = {key: measure.combine(read.batch.get(key), read.realtime.get(key))
              for key in read.batch.keys() | read.realtime.keys()}
    ranked = sorted(((k, v) for k, v in merged.items() if not overflowed(v)), key=lambda kv: (-kv[1], kv[0]))[:n]
    return TopAnswer(
        view=view.name, measure=measure.name, n=n,
        window=WindowSpan(**span(starts[0], view.window.seconds)) if starts and view.window else None,
        top=[TopEntry(key=k, value=_typed(measure.name, v, integral)) for k, v in ranked],
        generation=read.generation.generation, version=read.generation.version, logic=read.generation.logic or None,
    )
