"""A realtime row's next value: its committed parts with a micro-batch's increments folded in.

A realtime row is one hash field (``serving.store.keys``), a JSON array laid out as a batch row:
each scalar measure's value as a string ('' = none; Python's shortest round-trip spelling, so no
digit of a sum is lost), then each distinct measure's values as an exact list while there are at
most ``exact_max`` of them, else null (the values are then in a HyperLogLog beside the row).

The speed layer merges here, in its Spark tasks, rather than in Redis: Redis is the one shared,
single-threaded part of the write, and decoding, folding and re-encoding rows in Lua cost it
several times what storing them does. Redis then only checks that the rows are still the ones
merged from (``speed_layer.segments``) and stores the results.

A session view's realtime row is its key's session part instead (``shared_logic.session_parts.encode_part``): a
micro-batch's parts are merged into it by the one session merge (``merge_sessions``), folded past the view's
``max_sessions``, and stored through the same guarded, undo-logged call as any row.

A sum that leaves what a double holds is kept as ``inf`` (``shared_logic.measures.OVERFLOW_PART``, whatever
its sign: it absorbs every later increment, as the batch part's does), its score too: never an error, so
no micro-batch fails on it. Increments are finite otherwise (poison events are left out upstream).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import orjson

from shared_logic.measures import OVERFLOW_PART, Measure
from shared_logic.session_parts import decode_part, encode_part
from shared_logic.sessions import SessionWindow, merge_parts


@dataclass
class Merged:
    """One row's new value and what its write needs beside the hash field."""

    row: bytes
    #: Per scalar measure, the new value ('' = unchanged: no sorted-set update).
    scores: list[str]
    #: Per distinct measure, whether its sketch existed before (to be saved in the undo log).
    sketched: list[bool]
    #: Per distinct measure, the values to add to its sketch (all of them when the row turns into one).
    sketch_adds: list[list[str]]


def merge(old: bytes | str | None, kinds: Sequence[str], values: Sequence[Sequence[str | None]],
          members: Sequence[Sequence[Sequence[str] | None]], exact_max: int) -> Merged:
    """``old`` (a row field, or None) with increments folded in: ``values[j]`` the increments' values of scalar
    measure j (``kinds[j]``: count, sum, min or max; None = none), ``members[j]`` their value lists of distinct
    measure j. Increments fold in the order given, then into the old value (the order Spark's do not change)."""
    nk = len(kinds)
    parts: list = orjson.loads(old) if old else [""] * nk + [[] for _ in members]
    scores = [""] * nk
    for j in range(nk):
        acc = _fold(kinds[j], values[j])
        if acc is None:
            continue
        prior = parts[j]
        if prior != "":
            kind, p = kinds[j], float(prior)
            acc = (p if p < acc else acc) if kind == "min" else (p if p > acc else acc) if kind == "max" else acc + p
        if not math.isfinite(acc):  # an overflowed sum (NaN too: inf + -inf), absorbing; Redis ranks inf, not NaN
            acc = OVERFLOW_PART
        parts[j] = scores[j] = repr(acc)
    sketched, adds = [], []
    for j, lists in enumerate(members):
        have = parts[nk + j]
        new = [m for ms in lists if ms for m in ms]
        sketched.append(have is None)
        if have is None:
            adds.append(new)
            continue
        union = list(dict.fromkeys(have + new)) if new else have
        if len(union) > exact_max:
            parts[nk + j] = None
            adds.append(union)
        else:
            parts[nk + j] = union
            adds.append(_NO_VALUES)
    return Merged(orjson.dumps(parts), scores, sketched, adds)


def merge_sessions(old: bytes | str | None, increments: Sequence[str | None], window: SessionWindow,
                   measures: Sequence[Measure]) -> Merged:
    """A session view's realtime row (its key's part, ``shared_logic.session_parts.encode_part``) with a micro-batch's
    parts merged in by the one session merge (``merge_parts``): no score, no sketch."""
    parts = [decode_part(measures, old), *(decode_part(measures, text) for text in increments if text)]
    merged = merge_parts(window, measures, *parts)
    return Merged(encode_part(measures, merged).encode(), [], [], [])


#: What a row that keeps its values as a list adds to a sketch (shared: never changed).
_NO_VALUES: list[str] = []


def _fold(kind: str, values: Sequence[str | None]) -> float | None:
    if len(values) == 1:  # the common case: one increment of the row a micro-batch
        v = values[0]
        return None if v is None else float(v)
    xs = [float(v) for v in values if v is not None]
    if not xs:
        return None
    if kind == "min":
        return min(xs)
    if kind == "max":
        return max(xs)
    acc = xs[0]
    for x in xs[1:]:
        acc += x
    return acc
