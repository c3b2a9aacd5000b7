"""Card payments: spend per user, all time and per hour."""

from __future__ import annotations

from datetime import datetime, timedelta

from pyspark.sql import DataFrame

from shared_logic.measures import Average, Count, Distinct, Max, Min, Sum
from shared_logic.pipeline import EventModel, Pipeline
from shared_logic.views import TumblingWindow, View


class Payment(EventModel):
    user_id: str
    merchant: str
    amount: float
    event_time: datetime | None = None


_SPEND = (Count(), Sum("amount"), Min("amount"), Max("amount"), Distinct("merchant"))


class Payments(Pipeline):
    name = "payments"
    event_model = Payment
    views = (
        View(
            "spend_by_user",
            keys=("user_id",),
            measures=_SPEND,
            derived=(Average("amount"),),
            description="Payments per user: how many, how much, smallest, largest, distinct merchants.",
        ),
        View(
            "spend_by_user_hourly",
            keys=("user_id",),
            measures=_SPEND,
            window=TumblingWindow(timedelta(hours=1)),
            derived=(Average("amount"),),
            description="The same per 1-hour event-time window.",
        ),
    )

    def transform(self, events: DataFrame) -> DataFrame:
        return events.select("user_id", "merchant", "amount", "event_time")


pipeline = Payments()
