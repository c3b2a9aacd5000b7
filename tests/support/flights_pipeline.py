"""A small pipeline with a composite key, for tests: flights per route (origin, dest), all time and per hour.

Used as ``pipeline="tests.support.flights_pipeline"``. ``delay`` is an integer (minutes).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from pyspark.sql import DataFrame

from shared_logic.measures import Count, Max, Sum
from shared_logic.pipeline import EventModel, Pipeline
from shared_logic.views import TumblingWindow, View


class Flight(EventModel):
    origin: str
    dest: str
    delay: int
    event_time: datetime | None = None


_MEASURES = (Count(), Sum("delay"), Max("delay"))


class Flights(Pipeline):
    name = "flights"
    event_model = Flight
    views = (
        View("flights_by_route", keys=("origin", "dest"), measures=_MEASURES, description="Flights per route."),
        View("flights_by_route_hourly", keys=("origin", "dest"), measures=_MEASURES,
             window=TumblingWindow(timedelta(hours=1)), description="Flights per route and hour."),
    )

    def transform(self, events: DataFrame) -> DataFrame:
        return events.select("origin", "dest", "delay", "event_time")


pipeline = Flights()
