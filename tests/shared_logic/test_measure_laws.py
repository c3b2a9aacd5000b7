"""Every measure is a commutative monoid whose parts split: what the merged answer's exactness rests on.

README, "Why the merged answer is exact": an answer combines a view row's batch part with its
realtime part, and where the rows divide between the two (and between micro-batches and their
hash partitions) depends on when the barrier fell. That is exact only if each measure's
``combine`` has an identity (``None``: no view row in that part), is associative and commutative,
and folding the parts of any partition of a group's rows gives the part of all of them. The part
of a group is checked against a plain-Python reference of what the measure's Spark ``aggregate()``
computes (nulls skipped; a part with no rows is no view row: ``None``).

The rule for zeros: IEEE's ``-0.0 == 0.0`` lets ``min`` keep whichever zero came first, so a part
may hold either; ``combine`` reads a zero minimum or maximum as ``0.0``, and every answer is made
by ``combine`` (from ``None``, part by part). So the laws hold exactly, sign included, for the
parts as ``combine`` leaves them (``canon``), and any split answers the sign the whole does.

Every concrete measure of ``shared_logic.measures`` needs an entry in ``LAWS`` (found by walking
``Measure``'s subclasses): a new measure without one fails ``test_every_measure_has_its_laws``.
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared_logic.measures import OVERFLOW, Average, Count, Distinct, Max, Measure, Min, Sum

LAWS_SETTINGS = settings(max_examples=100, deadline=None, database=None)  # x5 measures: 500 cases a law


def zero_is_positive(v: Any) -> Any:
    """The rule for a minimum's or maximum's zero (ints have no sign and stay ints)."""
    return 0.0 if isinstance(v, float) and v == 0 else v


def nonnull(xs: list[Any]) -> list[Any]:
    return [x for x in xs if x is not None]


def extreme(pick: Callable[[list[Any]], Any]) -> Callable[[list[Any]], Any]:
    return lambda xs: pick(nonnull(xs)) if nonnull(xs) else None  # the first zero met, of either sign


@dataclass(frozen=True, repr=False)
class Law:
    """How to check one measure: its input column, its aggregate in plain Python, what "equal" is."""

    values: st.SearchStrategy[Any]  # one value of the column read (None: a null)
    reference: Callable[[list[Any]], Any]  # a group's part, as ``aggregate()`` computes it
    same: Callable[[Any, Any], bool] = lambda a, b: a == b
    canon: Callable[[Any], Any] = lambda v: v  # a part as combine leaves it (the zero rule)


def same_signed(a: Any, b: Any) -> bool:
    """Equal, and a float zero with the same sign (``-0.0 == 0.0`` in Python)."""
    if isinstance(a, float) and isinstance(b, float) and a == b == 0:
        return math.copysign(1, a) == math.copysign(1, b)
    return a == b and (a is None) == (b is None)


INTS = st.integers(-(2**53), 2**53)  # a long column, exact below 2^53 in doubles too
#: NaN and infinities never reach a view: ingest refuses them (``allow_inf_nan=False``).
FLOATS = st.one_of(st.sampled_from([0.0, -0.0]), st.floats(allow_nan=False, allow_infinity=False))
NUMBERS = st.one_of(st.none(), INTS, FLOATS)

LAWS: dict[type[Measure], Law] = {
    Count: Law(NUMBERS, len),
    Sum: Law(st.one_of(st.none(), INTS), lambda xs: sum(nonnull(xs))),  # exact laws: integers
    Min: Law(NUMBERS, extreme(min), same_signed, zero_is_positive),
    Max: Law(NUMBERS, extreme(max), same_signed, zero_is_positive),
    # collect_set of the values cast to string; combine answers a set, Spark an array: compare as sets.
    Distinct: Law(st.one_of(st.none(), st.text(max_size=3)),
                  lambda xs: sorted({str(x) for x in nonnull(xs)}), lambda a, b: set(a) == set(b)),
}
MEASURES = [Count(), Sum("x"), Min("x"), Max("x"), Distinct("x")]


def concrete_measures(cls: type = Measure) -> set[type]:
    found = set()
    for sub in cls.__subclasses__():
        if sub.__module__ == "shared_logic.measures" and not getattr(sub, "__abstractmethods__", None):
            found.add(sub)
        found |= concrete_measures(sub)
    return found


def test_every_measure_has_its_laws() -> None:
    missing = sorted(c.__name__ for c in concrete_measures() - set(LAWS))
    assert not missing, (
        f"measures {missing} have no law test: add each to LAWS in {__file__} (a strategy of its column's "
        "values, a plain-Python reference of what its aggregate() computes over a group) and an instance to MEASURES")
    assert {type(m) for m in MEASURES} == set(LAWS)


@functools.cache
def parts(law: Law) -> st.SearchStrategy[Any]:
    """Three parts as view rows hold them: each the aggregate of some rows, or None (no row in that part).
    (Built once per law: a strategy built anew for every example is validated anew, which is slow.)"""
    part = st.one_of(st.none(), st.lists(law.values, min_size=1, max_size=6).map(law.reference))
    return st.tuples(part, part, part)


ids = [type(m).__name__ for m in MEASURES]


@pytest.mark.parametrize("measure", MEASURES, ids=ids)
@LAWS_SETTINGS
@given(data=st.data())
def test_combine_has_an_identity_and_is_associative_and_commutative(measure: Measure, data: st.DataObject) -> None:
    law = LAWS[type(measure)]
    a, b, c = data.draw(parts(law))
    f = measure.combine
    if a is not None:
        assert law.same(f(a, None), law.canon(a)) and law.same(f(None, a), law.canon(a))
    assert law.same(f(f(a, b), c), f(a, f(b, c)))
    assert law.same(f(a, b), f(b, a))


@functools.cache
@st.composite
def partitions(draw: st.DrawFn, values: st.SearchStrategy[Any]) -> tuple[list[Any], list[list[Any]]]:
    """A group's rows and any partition of them into 1-5 parts (some maybe empty), in any order."""
    rows = draw(st.lists(values, min_size=1, max_size=12))
    k = draw(st.integers(1, 5))
    home = draw(st.lists(st.integers(0, k - 1), min_size=len(rows), max_size=len(rows)))
    split = [[r for r, h in zip(rows, home) if h == i] for i in range(k)]
    return rows, draw(st.permutations(split))


@pytest.mark.parametrize("measure", MEASURES, ids=ids)
@LAWS_SETTINGS
@given(data=st.data())
def test_the_parts_of_any_split_combine_to_the_part_of_the_whole(measure: Measure, data: st.DataObject) -> None:
    law = LAWS[type(measure)]
    rows, split = data.draw(partitions(law.values))
    part_of = [law.reference(p) if p else None for p in split]
    answer = functools.reduce(measure.combine, part_of, None)  # as the serving layer merges parts
    assert law.same(answer, law.canon(law.reference(rows))), part_of


# -- the zero rule ------------------------------------------------------------------------------------

STORED = st.one_of(st.none(), st.sampled_from([0.0, -0.0, 0, -1.5, 2.5]))  # a part may hold either zero


@pytest.mark.parametrize("measure", [Min("x"), Max("x")], ids=["Min", "Max"])
@LAWS_SETTINGS
@given(a=STORED, b=STORED)
def test_a_zero_minimum_or_maximum_is_positive_whichever_part_held_it(measure: Measure, a: Any, b: Any) -> None:
    """Combining parts that hold a zero of either sign gives the rule's zero, 0.0, in either order."""
    pick = min if isinstance(measure, Min) else max
    present = [v for v in (a, b) if v is not None]
    want = zero_is_positive(pick(present)) if present else None
    assert same_signed(measure.combine(a, b), want) and same_signed(measure.combine(b, a), want)


# -- float sums: exact commutativity, associativity within rounding -----------------------------------

SUM_FLOATS = st.floats(min_value=-1e300, max_value=1e300)  # finite, and a dozen of them never overflow


def close_to_exact(got: float, terms: list[float]) -> bool:
    """Within the error bound of any order of float additions of n ``terms`` around their exact sum,
    (n-1)·u·Σ|x| with u = eps/2 (Higham, Accuracy and Stability, 4.2), here n·eps·Σ|x| to spare the
    second-order terms. A relative tolerance (``math.isclose``'s default) would be wrong: under
    cancellation (1e16 + 1 - 1e16) the error is relative to Σ|x|, not to the sum."""
    bound = len(terms) * sys.float_info.epsilon * math.fsum(map(abs, terms))
    return math.isclose(got, math.fsum(terms), rel_tol=0, abs_tol=bound)


@LAWS_SETTINGS
@given(a=SUM_FLOATS, b=SUM_FLOATS, c=SUM_FLOATS)
def test_a_float_sum_commutes_exactly_and_associates_within_rounding(a: float, b: float, c: float) -> None:
    """IEEE addition is commutative but not associative: a float Sum is exact only to rounding, whatever the
    split (the README's exact numbers are integer sums)."""
    f = Sum("x").combine
    assert f(a, b) == f(b, a)
    assert close_to_exact(f(f(a, b), c), [a, b, c]) and close_to_exact(f(a, f(b, c)), [a, b, c])


@LAWS_SETTINGS
@given(partitions(SUM_FLOATS))
def test_a_float_sum_of_any_split_is_the_whole_within_rounding(case: tuple[list[float], list[list[float]]]) -> None:
    rows, split = case
    folded = functools.reduce(Sum("x").combine, [sum(p) if p else None for p in split])
    assert close_to_exact(folded, rows)


# -- derived values ---------------------------------------------------------------------------------

@LAWS_SETTINGS
@given(partitions(INTS))
def test_an_average_over_merged_parts_is_the_mean_of_every_value(case: tuple[list[int], list[list[int]]]) -> None:
    """Averages are never stored or combined: ``compute`` divides the merged Sum by the merged Count. (Every
    row has a value here: Count counts rows, so over a column with nulls this is sum / rows, not SQL's AVG.)"""
    rows, split = case
    total, count = Sum("x"), Count()
    merged = {
        "sum_x": functools.reduce(total.combine, [sum(p) if p else None for p in split]),
        "count": functools.reduce(count.combine, [len(p) if p else None for p in split]),
    }
    assert Average("x").compute(merged) == sum(rows) / len(rows)
    assert Average("x").compute({"sum_x": None, "count": None}) is None
    assert Average("x").compute({"sum_x": 0, "count": 0}) is None


# -- overflow ---------------------------------------------------------------------------------------

OVERFLOWING = st.one_of(st.none(), st.just(math.inf), st.just(OVERFLOW), st.floats(min_value=-1e308, max_value=1e308))


@LAWS_SETTINGS
@given(a=OVERFLOWING, b=OVERFLOWING, c=OVERFLOWING)
def test_an_overflowed_sum_absorbs_every_part_and_is_never_a_number(a: Any, b: Any, c: Any) -> None:
    """A part kept as +inf (``OVERFLOW_PART``), or a merge that leaves the double range, answers OVERFLOW, never a
    number that is not finite; a part that overflowed makes every order of merging answer OVERFLOW."""
    f = Sum("x").combine
    whole = f(f(a, b), c)
    assert whole == OVERFLOW or math.isfinite(whole)
    if any(v == OVERFLOW or v == math.inf for v in (a, b, c)):
        assert whole == f(a, f(b, c)) == f(c, f(b, a)) == OVERFLOW
    assert f(1.5e308, 1.5e308) == OVERFLOW and Average("x").compute({"sum_x": OVERFLOW, "count": 2}) == OVERFLOW
