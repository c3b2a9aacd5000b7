"""Poison events: events the views leave out, found the same way by the batch and the speed layer.

An event is **poison** when the pipeline's transform, run on it alone, fails with an error caused by
its data (an SQLSTATE of class 22, "data exception": division by zero, a failed cast, an arithmetic
overflow, a bad date...; or a ``raise_error`` of the transform), or gives a row whose scalar measure
input (a float column a view's Sum, Min or Max reads) is NaN or infinite. Both layers evaluate the
transform through ``view_rows`` (which raises for such a row and evaluates every output column of
every row before any view's filter), so a micro-batch or snapshot holding a poison event fails its
query; the layer then finds the poison events with ``isolate`` and runs the query again on
``without`` them.

Why it is the same in both layers: whether an event is poison depends on the event alone (the
transform is row-local: the pipeline contract), never on which other events share its snapshot,
micro-batch or interval; so every layer leaves out the same events, and a merged answer stays the
view of exactly the other events at its version. Identical events are poison together: an event's
identity is the xxhash64 of its columns (``event_key``), the same function in every layer.

Why not Spark's non-ANSI mode (errors read as null): a null from a failed division cannot be told
from a null the event held (``Sum`` skips those and ``Count`` counts them), and an integer overflow
silently wraps. Here Spark's own errors decide, with the session's ANSI setting, so nothing is
guessed; the price is paid only when poison is there: ``isolate`` halves the input, a Spark job per
half, about ``log2(n)`` jobs per poison event among ``n`` events.

Pure DataFrame functions; ``isolate`` runs Spark jobs on the DataFrame it is given and nothing else.
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from py4j.protocol import Py4JError
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import DoubleType, FloatType, MapType, StructField

from shared_logic.measures import Distinct

if TYPE_CHECKING:
    from shared_logic.pipeline import Pipeline

#: The condition of a poison event whose transformed row has a non-finite measure input.
NON_FINITE = "NON_FINITE_MEASURE_INPUT"
#: Spark's condition for ``raise_error`` (the check of ``view_rows`` raises it, and so may a transform).
_RAISED = "USER_RAISED_EXCEPTION"
#: SQLSTATE class of errors caused by a value ("data exception", ISO SQL).
_DATA_EXCEPTION = "22"
#: A part of the input with at most this many distinct events is searched by halving its list of keys.
_FEW = 1024
_KEY = "__lp_event_key"
_MIN, _MAX = -(2**63), 2**63 - 1


def measure_inputs(pipeline: Pipeline) -> list[str]:
    """The columns scalar measures read in any view of ``pipeline`` (the ones checked for non-finite values)."""
    found: dict[str, None] = {}
    for view in pipeline.views:
        for measure in view.measures:
            if measure.column is not None and not isinstance(measure, Distinct):
                found[measure.column] = None
    return list(found)


def _finite_checked(fields: Iterable[StructField], inputs: Collection[str]) -> list[str]:
    return [f.name for f in fields if f.name in inputs and isinstance(f.dataType, (DoubleType, FloatType))]


def _not_finite(name: str) -> Column:
    return F.isnan(name) | (F.abs(name) == F.lit(math.inf))


def _evaluated(field: StructField) -> Column:
    """A column that computes ``field`` (xxhash64 takes no maps: their JSON instead)."""
    if isinstance(field.dataType, MapType):
        return F.to_json(F.struct(field.name))
    return F.col(field.name)


def view_rows(pipeline: Pipeline, events: DataFrame) -> DataFrame:
    """``pipeline.transform(events)``, every row checked: a row with a NaN or infinite scalar measure input
    raises (``raise_error``), and every output column is computed for every row (so the transform's own
    errors surface), whatever a view reads.

    Guarantee: the check is one filter on the transform's output, kept apart from every other filter (its
    condition is nondeterministic): filters before it (``without``'s) run first, filters after it (a view's)
    after, so every view's query, and every probe of ``isolate``, fails on the same rows."""
    rows = pipeline.transform(events)
    checked = _finite_checked(rows.schema.fields, set(measure_inputs(pipeline)))
    # Always true; it reads every column, and it is nondeterministic (the row id), so the optimizer neither
    # merges it with another filter nor moves one below it (Spark orders no conjuncts of one filter).
    every = F.xxhash64(F.monotonically_increasing_id(), *(_evaluated(f) for f in rows.schema.fields)) >= F.lit(_MIN)
    if checked:
        bad = F.concat_ws(", ", *(F.when(_not_finite(c), F.lit(c)) for c in checked))
        message = F.concat(F.lit(f"{NON_FINITE}: measure input is NaN or infinite: "), bad)
        every = F.when(functools.reduce(operator.or_, (_not_finite(c) for c in checked)),
                       F.raise_error(message)).otherwise(every)
    return rows.where(every)


def event_key(events: DataFrame, ignore: Collection[str] = ()) -> Column:
    """An event's identity: xxhash64 of its columns (by name, sorted), but ``ignore``'s (``_version``)."""
    return F.xxhash64(*(F.col(c) for c in sorted(events.columns) if c not in ignore and c != _KEY))


def without(events: DataFrame, poison: Iterable[PoisonEvent | int], ignore: Collection[str] = ()) -> DataFrame:
    """``events`` but the poison ones (every copy of each: identical events are poison together)."""
    keys = sorted({p.key if isinstance(p, PoisonEvent) else p for p in poison})
    return events.where(~event_key(events, ignore).isin(keys)) if keys else events


@dataclass(frozen=True)
class DataError:
    """A query failure caused by a row's data: Spark's condition and its message (first line)."""

    condition: str
    message: str


def data_error(error: BaseException) -> DataError | None:
    """The data error behind ``error`` (it or one of its causes, in Python or in the JVM), or None when it is
    no such error (then it is no poison event's doing: Redis, the JVM, a bug). Told by Spark's condition and
    SQLSTATE, never text. The JVM's causes count: a row's error inside a write task can reach Python as a
    ``TASK_WRITE_FAILED`` that PySpark does not convert (as JVM Delta's writer raises it when the projection
    runs outside whole-stage code generation, which Spark falls back from on wide plans)."""
    seen: Any = error
    for _ in range(16):
        if seen is None:
            return None
        spark_error = _spark_error(seen)
        if spark_error is not None and (spark_error.condition == _RAISED or spark_error.state.startswith(_DATA_EXCEPTION)):
            return DataError(spark_error.condition, spark_error.message)
        seen = _cause(seen)
    return None


@dataclass(frozen=True)
class _SparkError:
    condition: str
    state: str
    message: str


def _spark_error(seen: Any) -> _SparkError | None:
    """``seen``'s condition, SQLSTATE and first message line if it is a Spark error (a PySparkException, or a
    JVM throwable implementing SparkThrowable), else None."""
    condition_of, state_of = getattr(seen, "getCondition", None), getattr(seen, "getSqlState", None)
    if condition_of is None or state_of is None:
        return None
    try:
        condition, state = condition_of(), state_of()
        message = getattr(seen, "getMessage", lambda: "")() or str(seen)
    except Py4JError:  # a JVM throwable that is no SparkThrowable (py4j answers any method name)
        return None
    first = message.strip().splitlines()[0] if message and message.strip() else ""
    return _SparkError(condition or "", state or "", first)


def _cause(seen: Any) -> Any:
    """What caused ``seen``: a Python error's cause, else the JVM throwable a Py4JJavaError carries, else a
    JVM throwable's own cause."""
    if isinstance(seen, BaseException):
        return getattr(seen, "_cause", None) or seen.__cause__ or getattr(seen, "java_exception", None)
    try:
        return seen.getCause()
    except Py4JError:
        return None


@dataclass(frozen=True)
class PoisonEvent:
    """A poison event: its identity (``event_key``), one copy's columns, how many identical copies the
    input held, why it is poison (``condition``, ``reason``) and the measure input at fault, if one is."""

    key: int
    event: dict[str, Any] = field(compare=False)
    copies: int
    condition: str
    reason: str
    field: str | None = None


@dataclass(frozen=True)
class _Part:
    """A part of the input searched: the events with keys in ``lo..hi``, or with one of ``keys``; and what is
    known of it: how it failed (``failure``, seen on it), or that it must fail (its other half passed)."""

    lo: int = _MIN
    hi: int = _MAX
    keys: tuple[int, ...] | None = None
    failure: DataError | None = None
    must_fail: bool = False
    #: ``failure`` is the caller's (how the whole input failed, maybe past ``view_rows``: in an aggregate or
    #: a write), not a probe's: it narrows the search but never names one event poison unprobed.
    told: bool = False

    def where(self) -> Column:
        key = F.col(_KEY)
        return key.isin(list(self.keys)) if self.keys is not None else key.between(F.lit(self.lo), F.lit(self.hi))

    @property
    def fails(self) -> bool:
        return self.failure is not None or self.must_fail

    def seen(self, failure: DataError | None) -> _Part:
        """This part, failing as ``failure`` (None: it passed), as a probe saw it."""
        return replace(self, failure=failure, told=False)

    def halves(self, keys: tuple[int, ...] | None) -> tuple[_Part, _Part]:
        """Its two halves, by ``keys`` (its distinct keys, when known) or else by key range."""
        if keys is not None:
            cut = len(keys) // 2
            return _Part(keys=keys[:cut]), _Part(keys=keys[cut:])
        middle = self.lo + (self.hi - self.lo) // 2
        return _Part(self.lo, middle), _Part(middle + 1, self.hi)


def isolate(pipeline: Pipeline, events: DataFrame, *, ignore: Collection[str] = (),
            failure: DataError | None = None) -> list[PoisonEvent]:
    """The poison events among ``events`` (columns in ``ignore``, such as ``_version``, are not the event's),
    by key. ``failure``: how ``view_rows`` over all of them failed, when known (saves one job).

    Halving: a failing part is cut in two (by its list of keys once it has at most ``_FEW`` distinct
    events, else by key range); its first half is tried, and the second too unless the first passed
    (then the second must fail), until one event, with its identical copies, fails alone: about
    ``log2(n)`` jobs per poison event. Errors that are no data errors (``data_error``) are raised."""
    keyed = events.withColumn(_KEY, event_key(events, ignore)).persist()
    try:
        found: list[PoisonEvent] = []
        pending = [_Part(failure=failure, told=True)]
        while pending:
            part = pending.pop()
            subset = keyed.where(part.where())
            keys = part.keys
            if keys is None or len(keys) > 1:
                if not part.fails:
                    part = part.seen(_probe(pipeline, subset.drop(_KEY, *ignore)))
                    if part.failure is None:
                        continue
                keys = keys if keys is not None else _few_keys(subset)
            if keys is not None and len(keys) == 0:  # "must fail" but empty: nothing reproducible here
                continue
            if keys is not None and len(keys) == 1:  # one event: its own failure says why
                failed = (None if part.told else part.failure) or _probe(pipeline, subset.drop(_KEY, *ignore))
                if failed is not None:
                    found.append(_described(pipeline, subset, keys[0], failed, ignore))
                continue
            first, second = part.halves(keys)
            failed = _probe(pipeline, keyed.where(first.where()).drop(_KEY, *ignore))
            pending.append(replace(second, must_fail=failed is None))
            if failed is not None:
                pending.append(first.seen(failed))
        return sorted(found, key=lambda p: p.key)
    finally:
        keyed.unpersist()


def _probe(pipeline: Pipeline, events: DataFrame) -> DataError | None:
    """How ``view_rows`` over ``events`` fails with a data error (None: it does not fail)."""
    try:
        view_rows(pipeline, events).write.format("noop").mode("overwrite").save()
    except Exception as e:  # Spark raises many classes; data_error tells them apart
        found = data_error(e)
        if found is None:
            raise
        return found
    return None


def _few_keys(subset: DataFrame) -> tuple[int, ...] | None:
    """The distinct keys of ``subset``, ascending, when there are at most ``_FEW`` (else None)."""
    keys = [row[0] for row in subset.select(_KEY).distinct().limit(_FEW + 1).collect()]
    return tuple(sorted(keys)) if len(keys) <= _FEW else None


def _described(pipeline: Pipeline, subset: DataFrame, key: int, failed: DataError,
               ignore: Collection[str]) -> PoisonEvent:
    """The poison event of ``key``: one copy, the copies, and why (the measure input at fault, if one)."""
    group = subset.where(F.col(_KEY) == F.lit(key)).drop(_KEY, *ignore)
    summary = group.agg(F.count(F.lit(1)).alias("copies"), F.first(F.struct(*group.columns)).alias("event")).first()
    copies = summary["copies"] if summary is not None else 0
    event = summary["event"].asDict() if summary is not None and summary["event"] is not None else {}
    if failed.condition != _RAISED:
        return PoisonEvent(key, event, copies, failed.condition, failed.message)
    found = _non_finite(pipeline, group)
    if not found:  # the transform's own raise_error
        return PoisonEvent(key, event, copies, failed.condition, failed.message)
    reason = "measure input " + ", ".join(f"{name!r} is {value!r}" for name, value in found.items()) + \
        " (not a finite number)"
    return PoisonEvent(key, event, copies, NON_FINITE, reason, next(iter(found)))


def _non_finite(pipeline: Pipeline, group: DataFrame) -> dict[str, float]:
    """The non-finite measure inputs of ``group``'s transformed rows, by column (a few rows looked at)."""
    try:
        rows = pipeline.transform(group)
        checked = _finite_checked(rows.schema.fields, set(measure_inputs(pipeline)))
        values = rows.select(*checked).limit(100).collect() if checked else []
    except Exception as e:  # the transform raised for it after all: no input to name
        if data_error(e) is None:
            raise
        return {}
    found: dict[str, float] = {}
    for row in values:
        for name in checked:
            value = row[name]
            if isinstance(value, float) and not math.isfinite(value):
                found.setdefault(name, value)
    return found
