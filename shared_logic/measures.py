"""Monoid measures: the only kind of value a view stores.

Every measure has an identity and an associative, commutative ``combine``, so a value computed
over a snapshot (batch) combined with a value computed over the versions after it (speed) is the
value over everything, whatever the split. Averages and ratios are never stored: they are
``Derived`` values computed at query time from monoid parts.

**Zero has one sign.** IEEE 754's ``-0.0`` equals ``0.0``, so a minimum or maximum keeps whichever
zero it met first: Spark's aggregate in either layer, the speed layer's fold and the merge at query
time each met them in their own order. ``combine`` reads a zero as ``0.0`` (``unsigned_zero``), and
every answer's value is made by ``combine`` (a part alone too: it is combined with the identity),
so a minimum or maximum of zero is ``0.0`` in every answer, whichever part held the zeros. Sums are
``0.0`` already (IEEE: ``-0.0 + 0 == 0.0``).

**A sum that overflows is ``OVERFLOW``.** A sum's part is a double (an integer column's sum is
summed exactly as a long first). When it leaves what a double holds (the double sum became
infinite or NaN, or the long sum overflowed), the part is ``+inf`` wherever it is kept (gold
tables, Redis rows, rankings), whatever its sign: ``inf`` absorbs every other part, so both layers
and every merge keep it. ``Sum.combine`` answers such a value as ``OVERFLOW`` (absorbing: the
monoid laws hold), never as a number. Row inputs are finite (a non-finite input makes its event
poison: ``shared_logic.poison``), so no other measure can overflow.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

from pyspark.sql import Column
from pyspark.sql import functions as F

#: The value of a sum beyond what a double holds, in every answer (JSON, CSV): never a number.
OVERFLOW = "overflow"
#: How an overflowed sum's part is kept (gold tables, Redis rows and rankings): absorbing, whatever its sign.
OVERFLOW_PART = math.inf
#: Spark column types (``DataType.simpleString()``) a session part keeps exactly as a JSON number.
NUMBER_TYPES = frozenset({"tinyint", "smallint", "int", "bigint", "float", "double"})


def overflowed(value: Any) -> bool:
    """Whether ``value`` is an overflowed sum: ``OVERFLOW``, or a float that is not finite."""
    return value == OVERFLOW if isinstance(value, str) else isinstance(value, float) and not math.isfinite(value)


def unsigned_zero(value: Any) -> Any:
    """``value``, with ``-0.0`` read as ``0.0`` (anything else unchanged, ``None`` included)."""
    return abs(value) if value == 0 else value


@dataclass(frozen=True)
class Measure(ABC):
    """One monoid measure of a view. ``name`` is the column in gold tables and the field in answers."""

    column: str | None = None
    kind: ClassVar[str]
    #: True when the value only grows as rows are added (count, sum of non-negatives is NOT assumed).
    additive: ClassVar[bool] = False
    #: How ``combine`` merges two parts, when it is one of 'sum' (a + b), 'max' or 'min' (None the
    #: identity): a top-N then merges the store's rankings by a threshold, reading about n keys;
    #: '' (a measure of your own) makes it read every realtime row instead. Either way it is exact.
    combines: ClassVar[str] = ""

    @property
    def name(self) -> str:
        return self.kind if self.column is None else f"{self.kind}_{self.column}"

    def _input(self) -> Column:
        """The column this measure reads (Count reads none and never calls this)."""
        assert self.column is not None, f"{type(self).__name__} needs a column, e.g. {type(self).__name__}('amount')"
        return F.col(self.column)

    @abstractmethod
    def aggregate(self) -> Column:
        """The Spark aggregate expression giving this measure's part over a group of rows."""

    @abstractmethod
    def combine(self, a: Any, b: Any) -> Any:
        """The monoid operation on two parts (``None`` is the identity)."""

    #: Spark column types (``DataType.simpleString()``) ``event_part`` takes; None: any (checked when a session
    #: view's rows are aggregated, ``shared_logic.session_parts.check_session_inputs``).
    event_inputs: ClassVar[frozenset[str] | None] = None

    def event_part(self, value: Any) -> Any:
        """This measure's part over one row whose input holds ``value`` (a plain Python value; ``None``: null or
        no column), as a session view keeps it per session (``shared_logic.sessions``, JSON).

        Guarantee an override gives: ``combine`` over the ``event_part`` of any rows equals ``aggregate`` over
        them (the view's answer is then the measure's own), and the part is a JSON value (int, float, str,
        bool or None). A measure that does not override it is refused in a session view when the view is
        defined (``keeps_per_event``)."""
        raise NotImplementedError(f"{type(self).__name__} has no per-event part: it cannot be in a session view")

    @classmethod
    def keeps_per_event(cls) -> bool:
        """Whether this measure defines ``event_part``, so a session view can keep it."""
        return cls.event_part is not Measure.event_part


@dataclass(frozen=True)
class Count(Measure):
    """Number of rows. Identity 0, combine +."""

    kind: ClassVar[str] = "count"
    combines: ClassVar[str] = "sum"
    additive: ClassVar[bool] = True

    def aggregate(self) -> Column:
        return F.count(F.lit(1)).alias(self.name)

    def combine(self, a: Any, b: Any) -> Any:
        return (a or 0) + (b or 0)

    def event_part(self, value: Any) -> Any:
        return 1


@dataclass(frozen=True)
class Sum(Measure):
    """Sum of a numeric column (nulls skipped), as a double. Identity 0, combine +; ``OVERFLOW`` absorbs.

    The part is ``OVERFLOW_PART`` (+inf) when the sum leaves the double range, or an integer column's
    exact (long) sum overflows: ``try_sum`` answers null for that, never an error, so no group fails a
    query (the module docstring)."""

    kind: ClassVar[str] = "sum"
    combines: ClassVar[str] = "sum"
    additive: ClassVar[bool] = True

    def aggregate(self) -> Column:
        total = F.try_sum(self._input())
        value = total.cast("double")
        overflow = (total.isNull() & (F.count(self._input()) > 0)) | F.isnan(value) | \
            (F.abs(value) == F.lit(math.inf))
        return F.when(overflow, F.lit(OVERFLOW_PART)).otherwise(F.coalesce(value, F.lit(0.0))).alias(self.name)

    def combine(self, a: Any, b: Any) -> Any:
        if overflowed(a) or overflowed(b):
            return OVERFLOW
        # not ``a or 0``: a part of 0.0 stays a float (a sum over a float column answers 0.0, not 0)
        total = (0 if a is None else a) + (0 if b is None else b)
        return OVERFLOW if overflowed(total) else total

    #: A session part keeps an integer column's sum as a Python int (exact, whatever the split: see
    #: ``shared_logic.sessions``), a float column's as a float.
    event_inputs: ClassVar[frozenset[str] | None] = NUMBER_TYPES

    def event_part(self, value: Any) -> Any:
        return value


@dataclass(frozen=True)
class Min(Measure):
    """Smallest value of a column. Identity: absent (None), combine min."""

    kind: ClassVar[str] = "min"
    combines: ClassVar[str] = "min"

    def aggregate(self) -> Column:
        return F.min(self._input()).alias(self.name)

    def combine(self, a: Any, b: Any) -> Any:
        return unsigned_zero(b if a is None else a if b is None else min(a, b))

    event_inputs: ClassVar[frozenset[str] | None] = NUMBER_TYPES | {"string", "boolean"}

    def event_part(self, value: Any) -> Any:
        return value


@dataclass(frozen=True)
class Max(Measure):
    """Largest value of a column. Identity: absent (None), combine max."""

    kind: ClassVar[str] = "max"
    combines: ClassVar[str] = "max"

    def aggregate(self) -> Column:
        return F.max(self._input()).alias(self.name)

    def combine(self, a: Any, b: Any) -> Any:
        return unsigned_zero(b if a is None else a if b is None else max(a, b))

    event_inputs: ClassVar[frozenset[str] | None] = NUMBER_TYPES | {"string", "boolean"}

    def event_part(self, value: Any) -> Any:
        return value


@dataclass(frozen=True)
class Distinct(Measure):
    """Number of distinct values of a column.

    The part computed by Spark is the set of values (gold tables keep it, so Redis can be rebuilt).
    In Redis a row's batch part and its realtime part each keep the set exactly while it is small,
    else as a HyperLogLog. An answer from exact sets alone is exact; one that merges a
    HyperLogLog is within its standard error (0.81%) of the exact count.
    """

    kind: ClassVar[str] = "distinct"

    def aggregate(self) -> Column:
        return F.collect_set(self._input().cast("string")).alias(self.name)

    def combine(self, a: Any, b: Any) -> Any:
        return set(a or ()) | set(b or ())


@dataclass(frozen=True)
class Derived(ABC):
    """A value computed at query time from a view's monoid parts; never stored."""

    kind: ClassVar[str]
    column: str

    @property
    def name(self) -> str:
        return f"{self.kind}_{self.column}"

    @abstractmethod
    def requires(self) -> tuple[str, ...]:
        """Names of the measures this value is computed from."""

    @abstractmethod
    def compute(self, parts: dict[str, Any]) -> Any:
        """The value from the merged parts (``None`` when undefined)."""


@dataclass(frozen=True)
class Average(Derived):
    """Mean of a column: ``sum_<column> / count`` (needs Sum(column) and Count() in the view)."""

    kind: ClassVar[str] = "avg"

    def requires(self) -> tuple[str, ...]:
        return (f"sum_{self.column}", "count")

    def compute(self, parts: dict[str, Any]) -> Any:
        total, count = parts.get(f"sum_{self.column}"), parts.get("count")
        if overflowed(total):
            return OVERFLOW
        return None if not count or total is None else total / count
