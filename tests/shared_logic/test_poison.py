"""Poison events are found by their data alone, whatever else shares their input, and nothing else is.

The pipeline divides one field by another (``tests.support.ratio_pipeline``): a zero divisor fails
Spark's ANSI division, a tiny one gives an infinite ratio. ``isolate`` must find exactly the events
the plain-Python oracle calls poison (every identical copy of one), ``without`` must leave exactly
the others, and a view over them must equal the oracle's; whether the search halves lists of keys (a
micro-batch) or key ranges first (a snapshot of more than ``_FEW`` distinct events).
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from shared_logic import poison as poison_rule
from shared_logic.poison import NON_FINITE, data_error, event_key, isolate, view_rows, without
from tests.support import ratio_pipeline
from tests.support.ratio_pipeline import is_poison, oracle

GOOD = [{"user_id": f"u{i % 4}", "amount": float(i), "divisor": float(i % 3 + 1)} for i in range(12)]
ZERO = {"user_id": "u1", "amount": 6.0, "divisor": 0.0}
HUGE = {"user_id": "u2", "amount": 1e308, "divisor": 1e-10}


def frame(spark: Any, events: list[dict[str, Any]]) -> Any:
    return spark.createDataFrame([{**e, "event_time": None} for e in events],
                                 "user_id string, amount double, divisor double, event_time timestamp")


@pytest.mark.slow  # over 10 s: the end-to-end tier
@pytest.mark.parametrize("few", [1024, 2], ids=["by-key-lists", "by-key-ranges"])
def test_the_poison_events_are_found_alone_and_the_view_leaves_them_out(spark: Any, few: int,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(poison_rule, "_FEW", few)  # 2: the search halves key ranges before lists, as over a snapshot
    events = GOOD[:5] + [ZERO, HUGE] + GOOD[5:] + [ZERO]  # two identical copies of one poison event
    assert [e for e in events if is_poison(e)] == [ZERO, HUGE, ZERO]
    df = frame(spark, events)
    pipeline = ratio_pipeline.pipeline
    view = pipeline.view(ratio_pipeline.VIEW)
    with pytest.raises(Exception) as failed:  # the view's query fails on them: the signal to search
        view.aggregate(view_rows(pipeline, df)).collect()
    failure = data_error(failed.value)
    assert failure is not None and failure.condition in ("DIVIDE_BY_ZERO", "USER_RAISED_EXCEPTION")

    poison = isolate(pipeline, df, failure=failure)
    assert sorted((p.event["user_id"], p.copies) for p in poison) == [("u1", 2), ("u2", 1)]
    by_user = {p.event["user_id"]: p for p in poison}
    assert by_user["u1"].condition == "DIVIDE_BY_ZERO" and by_user["u1"].field is None
    assert by_user["u2"].condition == NON_FINITE and by_user["u2"].field == "ratio" and "inf" in by_user["u2"].reason

    rows = view.aggregate(view_rows(pipeline, without(df, poison))).collect()
    want = oracle(events)
    assert {r["user_id"] for r in rows} == set(want)
    for r in rows:
        for name in ("count", "sum_amount", "sum_ratio", "max_ratio"):
            assert math.isclose(r[name], want[r["user_id"]][name], rel_tol=1e-12), (r, want[r["user_id"]])


def test_an_event_s_key_ignores_the_columns_named_and_the_column_order(spark: Any) -> None:
    df = frame(spark, [ZERO])
    versioned = df.selectExpr("7L AS _version", "event_time", "divisor", "amount", "user_id")
    key = df.select(event_key(df).alias("k")).first()["k"]
    assert versioned.select(event_key(versioned, ("_version",)).alias("k")).first()["k"] == key


def test_a_clean_input_is_searched_for_nothing_and_other_errors_are_no_data_errors(spark: Any) -> None:
    assert isolate(ratio_pipeline.pipeline, frame(spark, GOOD)) == []
    from pyspark.errors import AnalysisException

    with pytest.raises(AnalysisException) as failed:
        frame(spark, GOOD).select("no_such_column").collect()
    assert data_error(failed.value) is None


def test_a_failure_past_the_rows_never_makes_a_lone_event_poison_unprobed(spark: Any) -> None:
    # How the caller's whole query failed, in an aggregate or a write (a sum past a type's range, say), is a
    # class-22 error that no single event's rows cause: one distinct event (a speed micro-batch's) is probed,
    # not named poison on the caller's word.
    beyond_the_rows = poison_rule.DataError("ARITHMETIC_OVERFLOW", "a sum overflowed in the aggregate")
    assert isolate(ratio_pipeline.pipeline, frame(spark, GOOD[:1] * 3), failure=beyond_the_rows) == []
    [found] = isolate(ratio_pipeline.pipeline, frame(spark, [ZERO]), failure=beyond_the_rows)
    assert found.condition == "DIVIDE_BY_ZERO", "its own failure says why, not the caller's"
