"""A pipeline with one view of each window kind beyond tumbling, for tests that must reach every route: plays
per song over 20-minute windows every 5 minutes (sliding) and each listener's listening sessions (a 30-minute
gap; the newest three kept, older ones folded).

Used as ``pipeline="tests.support.windows_pipeline"`` (a dotted module path, as a user's pipeline is).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from pyspark.sql import DataFrame

from shared_logic.measures import Count, Max, Sum
from shared_logic.pipeline import EventModel, Pipeline
from shared_logic.sessions import SessionWindow
from shared_logic.views import SlidingWindow, View

SIZE, SLIDE, GAP, KEEP = 1200, 300, 1800, 3


class Play(EventModel):
    song: str
    listener: str
    seconds: int
    event_time: datetime | None = None


class Windows(Pipeline):
    name = "windows"
    event_model = Play
    views = (
        View("plays_trending", keys=("song",), measures=(Count(), Sum("seconds"), Max("seconds")),
             window=SlidingWindow(timedelta(seconds=SIZE), timedelta(seconds=SLIDE)),
             description="Plays per song, 20-minute windows every 5 minutes."),
        View("listening", keys=("listener",), measures=(Count(), Sum("seconds")),
             sessions=SessionWindow(timedelta(seconds=GAP), max_sessions=KEEP),
             description="Each listener's listening sessions (30-minute gap), the newest three kept."),
    )

    def transform(self, events: DataFrame) -> DataFrame:
        return events


pipeline = Windows()
