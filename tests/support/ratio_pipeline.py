"""A pipeline whose transform divides one field by another, for tests of poison events and overflow.

Used as ``pipeline="tests.support.ratio_pipeline"``. ``ratio = amount / divisor``: a zero divisor fails
the transform (Spark's ANSI division by zero), a tiny one makes the ratio infinite; both events are
poison (``shared_logic.poison``). ``amount`` itself is summed, so two amounts of 1.5e308 overflow a
double. ``oracle`` is the plain-Python reference: the views over the events that are not poison.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from shared_logic.measures import Average, Count, Max, Sum
from shared_logic.pipeline import EventModel, Pipeline
from shared_logic.views import View

VIEW = "ratio_by_user"


class Reading(EventModel):
    user_id: str
    amount: float
    divisor: float
    event_time: datetime | None = None


class Ratios(Pipeline):
    name = "ratios"
    event_model = Reading
    views = (View(VIEW, keys=("user_id",), measures=(Count(), Sum("amount"), Sum("ratio"), Max("ratio")),
                  derived=(Average("amount"),), description="Per user: readings, amounts, ratios."),)

    def transform(self, events: DataFrame) -> DataFrame:
        return events.select("user_id", "amount", (F.col("amount") / F.col("divisor")).alias("ratio"), "event_time")


pipeline = Ratios()


def is_poison(event: dict[str, Any]) -> bool:
    """A zero divisor (the division fails) or a ratio that is not a finite number."""
    if event["divisor"] == 0:
        return True
    try:
        return not math.isfinite(event["amount"] / event["divisor"])
    except OverflowError:
        return True


def _sum(values: list[float]) -> float | str:
    """A double sum as both layers answer it: 'overflow' once it leaves the double range."""
    total = 0.0
    for v in values:
        total += v
    return total if math.isfinite(total) else "overflow"


def oracle(events: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The view per user over the events that are not poison (key -> measures, as the API answers them)."""
    by_user: dict[str, list[dict[str, Any]]] = {}
    for e in events:
        if not is_poison(e):
            by_user.setdefault(e["user_id"], []).append(e)
    views = {}
    for user, rows in by_user.items():
        amount = _sum([r["amount"] for r in rows])
        views[user] = {"count": len(rows), "sum_amount": amount, "sum_ratio": _sum([r["amount"] / r["divisor"]
                                                                                      for r in rows]),
                       "max_ratio": max(r["amount"] / r["divisor"] for r in rows),
                       "avg_amount": amount if amount == "overflow" else amount / len(rows)}
    return views
