"""A pipeline declaring an event id, for tests of the duplicates rule (``shared_logic.dedup``).

Used as ``pipeline="tests.support.dedup_pipeline"``: payments with a ``payment_id``; per user, the
count and the sum of amounts. ``oracle`` is the plain-Python reference: over commits in master order,
an id's first payment counts and every later one within the horizon (7 days, longer than any test) is
left out.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from pyspark.sql import DataFrame

from shared_logic.measures import Count, Sum
from shared_logic.pipeline import EventModel, Pipeline
from shared_logic.views import View

VIEW = "paid_by_user"


class Payment(EventModel):
    payment_id: str
    user_id: str
    amount: float
    event_time: datetime | None = None


class Payments(Pipeline):
    name = "dedup_payments"
    event_model = Payment
    event_id_field = "payment_id"
    views = (View(VIEW, keys=("user_id",), measures=(Count(), Sum("amount")), description="Per user: payments."),)

    def transform(self, events: DataFrame) -> DataFrame:
        return events.select("user_id", "amount", "event_time")


pipeline = Payments()


def oracle(commits: Sequence[Iterable[dict[str, Any]]]) -> dict[str, tuple[int, float]]:
    """Per user (count, sum of amounts) over ``commits`` in master order, each payment id counted once."""
    seen: set[str] = set()
    answer: dict[str, tuple[int, float]] = {}
    for commit in commits:
        for event in commit:
            if event["payment_id"] in seen:
                continue
            seen.add(event["payment_id"])
            count, total = answer.get(event["user_id"], (0, 0.0))
            answer[event["user_id"]] = (count + 1, total + event["amount"])
    return answer
