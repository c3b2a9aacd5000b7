"""A realtime row is the measures' monoid, encoded: folding increments into it is ``combine``.

A realtime row (``speed_layer.realtime_rows``) holds a view row's realtime parts as a JSON array;
each micro-batch ``merge``s its increments for the row (one per hash partition of its rows) into
it. The serving layer then combines the row with the batch part as if it were the part of every
row the speed layer saw. That holds if decoding a merged row gives the measures' ``combine`` of
the parts folded in: a monoid homomorphism. So, for increments with integer values (exact in the
doubles a row keeps, below 2^53): any cut of them into micro-batches, in any order, gives the
same row, and it decodes to the fold of their parts with ``Measure.combine``; merging no
increments leaves a row as it is, and the row of nothing is the identity. Distinct values stay an
exact list up to ``exact_max``, then the row says null and the sketch gets every value once.

Float values: the count, min and max are exact, the sum is exact to rounding, as in
``test_measure_laws``; a zero min or max answers ``0.0``, never ``-0.0``, whatever the order.
"""

from __future__ import annotations

import functools
import math
import sys
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from shared_logic.measures import Count, Distinct, Max, Min, Sum
from speed_layer.realtime_rows import merge

LAWS_SETTINGS = settings(max_examples=100, deadline=None, database=None)
KINDS = ["count", "sum", "min", "max"]
SCALARS = [Count(), Sum("x"), Min("x"), Max("x")]
DISTINCT = Distinct("m")

#: One increment: a partition's share of a micro-batch's rows of the view row (values, and members).
Chunk = tuple[list[float], list[str]]


def chunks(values: st.SearchStrategy[float]) -> st.SearchStrategy[list[Chunk]]:
    return st.lists(st.tuples(st.lists(values, min_size=1, max_size=4),
                              st.lists(st.sampled_from("abcdefgh"), max_size=3)), min_size=1, max_size=8)


INT_CHUNKS = chunks(st.integers(-(2**40), 2**40).map(float))  # integer values: exact in a row's doubles
FLOAT_CHUNKS = chunks(st.one_of(st.sampled_from([0.0, -0.0]), st.floats(min_value=-1e300, max_value=1e300)))
ZERO_CHUNKS = chunks(st.sampled_from([0.0, -0.0, 1.5, -1.5]))  # a zero minimum or maximum, often


def part_of(chunk: Chunk) -> list[Any]:
    """A chunk's parts, as its aggregate computes them: count, sum, min, max (a zero of either sign: the
    fold must not depend on which came first), distinct set."""
    xs, members = chunk
    return [float(len(xs)), math.fsum(xs), min(xs), max(xs), set(members)]


def apply(row: bytes | None, batch: list[Chunk], exact_max: int) -> tuple[bytes, set[str]]:
    """One micro-batch's merge (increments spelled as Spark's casts to string do); its sketch additions."""
    parts = [part_of(c) for c in batch]
    merged = merge(row, KINDS, [[repr(p[j]) for p in parts] for j in range(4)],
                   [[sorted(p[4]) for p in parts]], exact_max)
    return merged.row, set(merged.sketch_adds[0])


def fold(batches: list[list[Chunk]], exact_max: int) -> tuple[bytes, set[str]]:
    row, sketch = None, set()
    for batch in batches:
        row, added = apply(row, batch, exact_max)
        sketch |= added
    assert row is not None
    return row, sketch


def decode(row: bytes, sketch: set[str]) -> list[Any]:
    """The parts a reader takes from a row: numbers ('' = none), and the distinct values (list or sketch)."""
    parts = orjson.loads(row)
    return [None if p == "" else float(p) for p in parts[:4]] + [set(parts[4]) if parts[4] is not None else sketch]


@st.composite
def cut(draw: st.DrawFn, items: list[Chunk]) -> list[list[Chunk]]:
    """``items`` in any order, cut into consecutive micro-batches."""
    items = draw(st.permutations(items))
    ends = sorted(set(draw(st.lists(st.integers(1, len(items)), max_size=3))) | {len(items)})
    return [items[i:j] for i, j in zip([0, *ends], ends)]


def same_signed(a: Any, b: Any) -> bool:
    return a == b and (not isinstance(a, float) or math.copysign(1, a) == math.copysign(1, b))


@LAWS_SETTINGS
@given(data=st.data(), exact_max=st.integers(0, 6))
def test_a_merged_row_decodes_to_the_combine_of_its_parts_however_cut(data: st.DataObject, exact_max: int) -> None:
    increments = data.draw(INT_CHUNKS)
    one, one_sketch = fold([increments], exact_max)
    many, many_sketch = fold(data.draw(cut(increments)), exact_max)
    folded = functools.reduce(lambda acc, p: [m.combine(a, b) for m, a, b in zip([*SCALARS, DISTINCT], acc, p)],
                              [part_of(c) for c in increments])
    assert decode(one, one_sketch) == decode(many, many_sketch) == folded
    assert orjson.loads(one)[:4] == orjson.loads(many)[:4]  # spelled alike too: the sorted-set scores agree
    members = folded[4]
    if len(members) <= exact_max:
        assert sorted(orjson.loads(many)[4]) == sorted(members) and not many_sketch
    else:
        assert orjson.loads(many)[4] is None and many_sketch == members


@LAWS_SETTINGS
@given(batch=INT_CHUNKS, exact_max=st.integers(0, 6))
def test_merging_no_increments_is_the_identity(batch: list[Chunk], exact_max: int) -> None:
    none: list[list[Any]] = [[None]] * 4
    empty = merge(None, KINDS, none, [[None]], exact_max)
    assert orjson.loads(empty.row) == ["", "", "", "", []] and empty.scores == [""] * 4
    assert apply(empty.row, batch, exact_max)[0] == apply(None, batch, exact_max)[0]
    row, _ = apply(None, batch, exact_max)
    again = merge(row, KINDS, none, [[None]], exact_max)
    assert again.row == row and again.scores == [""] * 4 and again.sketch_adds == [[]]


@LAWS_SETTINGS
@given(data=st.data())
def test_float_rows_are_exact_but_for_the_rounding_of_sums(data: st.DataObject) -> None:
    increments = data.draw(FLOAT_CHUNKS)
    xs = [x for values, _ in increments for x in values]
    count, total, low, high, _ = decode(*fold(data.draw(cut(increments)), 64))
    assert count == len(xs) and low == min(xs) and high == max(xs)
    bound = 2 * len(xs) * sys.float_info.epsilon * math.fsum(map(abs, xs))  # any order of the additions is within
    assert math.isclose(total, math.fsum(xs), rel_tol=0, abs_tol=bound)


@LAWS_SETTINGS
@given(data=st.data(), batch_part=st.sampled_from([None, 0.0, -0.0]))
def test_a_zero_min_or_max_answers_positive_whichever_zero_came_first(data: st.DataObject, batch_part: Any) -> None:
    """The zero rule is ``combine``'s (``shared_logic.measures``): a row keeps the zero its fold met first
    (-0.0 == 0.0), and every answer reads it through ``combine``, with the batch part or alone, as 0.0."""
    increments = data.draw(ZERO_CHUNKS)
    xs = [x for values, _ in increments for x in values]
    _, _, low, high, _ = decode(*fold(data.draw(cut(increments)), 64))
    assert low == min(xs) and high == max(xs)
    for measure, got, want in ((Min("x"), low, min(xs)), (Max("x"), high, max(xs))):
        if batch_part is not None:
            want = min(want, batch_part) if isinstance(measure, Min) else max(want, batch_part)
        want = 0.0 if want == 0 else want
        assert same_signed(measure.combine(batch_part, got), want) and same_signed(measure.combine(got, batch_part), want)
