"""A pipeline with sliding views, for tests: plays (and distinct listeners) per song over 20-minute windows
every 5 minutes.

Used as ``pipeline="tests.support.trending_pipeline"`` (a dotted module path, as a user's pipeline is).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from pyspark.sql import DataFrame

from shared_logic.measures import Count, Distinct, Max, Min, Sum
from shared_logic.pipeline import EventModel, Pipeline
from shared_logic.views import SlidingWindow, View

SIZE, SLIDE = 1200, 300


class Play(EventModel):
    song: str
    seconds: int
    listener: str | None = None
    event_time: datetime | None = None


class Trending(Pipeline):
    name = "trending"
    event_model = Play
    views = (
        View("plays_trending", keys=("song",), measures=(Count(), Sum("seconds"), Min("seconds"), Max("seconds")),
             window=SlidingWindow(timedelta(seconds=SIZE), timedelta(seconds=SLIDE)),
             description="Plays per song, 20-minute windows every 5 minutes."),
        View("listeners_trending", keys=("song",), measures=(Count(), Distinct("listener")),
             window=SlidingWindow(timedelta(seconds=SIZE), timedelta(seconds=SLIDE)),
             description="Distinct listeners per song, 20-minute windows every 5 minutes."),
    )

    def transform(self, events: DataFrame) -> DataFrame:
        return events


pipeline = Trending()
