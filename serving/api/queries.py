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
from serving.api.times import at
from serving.api.windows import Span
from serving.store.reader import ServingStore
from serving.store.reads import Generation, KeyRead
from shared_logic.event_values import echo
from shared_logic.measures import OVERFLOW, Count, Measure, overflowed
from shared_logic.views import View

#: Longest key, ``prefix`` or key column filter a query takes, in characters (422 above; the routes
#: declare it as ``maxLength``). With the cursor's and the times' limits it keeps every request the
#: document allows (each character percent-encoded as up to 12 bytes) within the 65535 bytes of URL
#: the HTTP server reads, so each gets this API's answer; and the cursor after any such key fits
#: ``key_pages.MAX_CURSOR_CHARS``.
MAX_KEY_CHARS = 2048
@functools.lru_cache(maxsize=64)
def _at(epoch: float | None) -> datetime | None:
    """A generation's ``computed_at`` as a datetime (cached: every answer from a generation names it)."""
    return None if epoch is None else at(0) + timedelta(seconds=epoch)


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


def merged_value(view: View, read: KeyRead, integral: frozenset[str]) -> dict[str, Any] | None:
    """Every item of ``read`` (one key: its panes, or its one row) combined into the key's answer: every batch
    and realtime part with each measure's monoid, distinct counts as the union of all of them (the read's own,
    HyperLogLog by register union); None when no item holds a row."""
    if not any(_held(read, i) for i in range(len(read.batch))):
        return None
    return _finish(view, combine(view, [*read.batch, *read.realtime], integral), read.distinct_total)


def span_of(start: int, seconds: int) -> dict[str, datetime]:
    """A pane's or window's start and end, from its start and length (epoch seconds)."""
    return {"start": at(start), "end": at(start + seconds)}


def spans(span: Span) -> dict[str, Any]:
    """How an answer echoes what it addressed: the window or range asked (resolved), the panes it combined and
    the clock reading relative times were resolved against."""
    window = None if span.window is None else WindowSpan(start=at(span.window[0]), end=at(span.window[1]))
    given = None if span.range is None else WindowSpan(start=span.range[0], end=span.range[1])
    covered = span.covered
    return {"window": window, "range": given, "now": span.now,
            "covered": None if covered is None else WindowSpan(start=covered[0], end=covered[1])}


async def key_answer(store: ServingStore, view: View, key: str, span: Span | None = None, *,
                     explain: bool = False) -> KeyAnswer:
    """The exact measures of ``key`` in ``view`` over the panes ``span`` addresses (one window, a range, or all
    time: None)."""
    span = span or Span([])
    starts = span.panes
    items = [(key, s) for s in starts] if starts else [(key, None)]
    shape = _shape(view)
    read = await store.read(view.name, items, shape.scalar_names, shape.distinct_names)
    present = [_held(read, i) for i in range(len(items))]
    if not any(present):
        where = f" in the {len(starts)} pane(s) asked for" if starts else ""
        raise NotFoundError(f"key {echo(key)} not found in view {view.name!r}{where} "
                            f"(as of master version {read.generation.version})")
    served = read.generation.generation
    integral = _known_integral(store, served, view)
    if integral is None:
        integral = await integral_measures(store, served, view)
    value = merged_value(view, read, integral)
    assert value is not None, "an item holds a row"
    answer = _answer(view, key, read.generation, value)
    if starts:
        for name, echoed in spans(span).items():
            setattr(answer, name, echoed)
        if span.range is not None or len(starts) > 1:
            answer.windows = [WindowValue(**span_of(s, span.pane_seconds), value=row_value(view, read, i, integral) or {})
                              for i, s in enumerate(starts) if present[i]]
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


#: How a measure must combine to rank over several panes (the threshold merge, ``serving.store.threshold``).
RANKS_OVER_PANES = ("sum", "max", "min")


def _ranking(view: View, name: str, panes: int) -> Measure:
    """The scalar measure ``name`` of ``view``, or a 422 naming the ones a top-N ranks by (over several panes:
    those that combine by sum, max or min)."""
    rankable = [m for m in view.scalar_measures if panes <= 1 or m.combines in RANKS_OVER_PANES]
    names = [m.name for m in rankable]
    for measure in view.scalar_measures:
        if measure.name == name:
            if measure in rankable:
                return measure
            raise BadQueryError(f"measure: {name!r} combines in its own way (combines={measure.combines!r}), so it "
                                f"ranks in one pane only; ask one pane (window_start of a tumbling view) or rank by "
                                f"one of {names}")
    derived = {d.name: d for d in view.derived}
    what = ("is empty" if not name else "is a distinct count (a HyperLogLog: not ranked; its distinct values per "
            "key are on the key route)" if name in {m.name for m in view.distinct_measures}
            else f"is derived at query time from {list(derived[name].requires())} (not a monoid: ranking it needs "
                 "every key's value; rank by one of those and read it on the key route)" if name in derived
            else f"is not a measure of view {view.name!r}")
    if not names:
        raise BadQueryError(f"measure: {echo(name)} {what}; view {view.name!r} has no measure a top-N ranks by "
                            f"{'over several panes' if panes > 1 else ''}")
    raise BadQueryError(f"measure: {echo(name)} {what}; top-N ranks by one of {names} (leave measure out for "
                        f"{names[0]!r})")


def _answer(view: View, key: str, served: Generation, value: dict[str, Any]) -> KeyAnswer:
    return KeyAnswer(
        view=view.name, key=key, value=value, generation=served.generation, version=served.version,
        computed_at=_at(served.computed_at), logic=served.logic or None,
    )


async def top_answer(store: ServingStore, view: View, measure_name: str | None, n: int,
                     span: Span | None = None) -> TopAnswer:
    """The exact top ``n`` keys of ``view`` by a scalar measure of the merged values over the panes ``span``
    addresses (ties: key order), of the keys whose value is a number (an overflowed sum is not ranked). No
    ``measure_name``: the view's first rankable measure; one the view lacks (or empty) is a 422 naming them.
    One pane: the batch ranking and realtime set merged (``TOP``); several: every pane's, by the threshold
    merge (``RANGE_TOP``), each key's parts folded with ``Measure.combine`` in the order the store merged them."""
    span = span or Span([])
    panes = len(span.panes)
    if measure_name is None:  # the first measure it can rank by
        measure_name = next((m.name for m in view.scalar_measures if panes <= 1 or m.combines in RANKS_OVER_PANES), "")
    measure = _ranking(view, measure_name, panes)
    merged: dict[str, Any]
    if panes <= 1:
        read = await store.top(view.name, measure.name, span.panes[0] if span.panes else None, n, measure.combines)
        served = read.generation
        merged = {key: measure.combine(read.batch.get(key), read.realtime.get(key))
                  for key in read.batch.keys() | read.realtime.keys()}
    else:
        ranged = await store.top_range(view.name, measure.name, span.panes, n, measure.combines)
        served = ranged.generation
        merged = {key: functools.reduce(measure.combine, parts, None) for key, parts in ranged.parts.items()}
    integral = await integral_measures(store, served.generation, view)
    ranked = sorted(((k, v) for k, v in merged.items() if not overflowed(v)), key=lambda kv: (-kv[1], kv[0]))[:n]
    return TopAnswer(
        view=view.name, measure=measure.name, n=n, **spans(span),
        top=[TopEntry(key=k, value=_typed(measure.name, v, integral)) for k, v in ranked],
        generation=served.generation, version=served.version, logic=served.logic or None,
    )
