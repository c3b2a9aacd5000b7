"""A small pipeline with integer columns, for tests: orders per shop, all time and per hour.

Used as ``pipeline="tests.support.int_pipeline"`` (a dotted module path, as a user's pipeline is).
``items`` and ``cents`` are integers; ``euros`` (cents / 100) is a float, so one view holds
integral sums, minima and maxima beside a float sum.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from shared_logic.measures import Average, Count, Max, Min, Sum
from shared_logic.pipeline import EventModel, Pipeline
from shared_logic.views import TumblingWindow, View


class Order(EventModel):
    shop: str
    items: int
    cents: int
    event_time: datetime | None = None


_MEASURES = (Count(), Sum("items"), Min("items"), Max("cents"), Sum("euros"))


class Orders(Pipeline):
    name = "orders"
    event_model = Order
    views = (
        View("orders_by_shop", keys=("shop",), measures=_MEASURES, derived=(Average("items"),),
             description="Orders per shop: how many, items, fewest items, largest order, euros."),
        View("orders_by_shop_hourly", keys=("shop",), measures=_MEASURES, derived=(Average("items"),),
             window=TumblingWindow(timedelta(hours=1)), description="The same per 1-hour window."),
    )

    def transform(self, events: DataFrame) -> DataFrame:
        return events.select("shop", "items", "cents", (F.col("cents") / 100).alias("euros"), "event_time")


pipeline = Orders()
