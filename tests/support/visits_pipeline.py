"""A pipeline with session views, for tests: each user's visits (runs of their page views no more than 30
minutes apart), unbounded and bounded to two sessions a user, beside an all-time view.

Used as ``pipeline="tests.support.visits_pipeline"`` (a dotted module path, as a user's pipeline is).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from pyspark.sql import DataFrame

from shared_logic.measures import Count, Distinct, Max, Min, Sum
from shared_logic.pipeline import EventModel, Pipeline
from shared_logic.sessions import SessionWindow
from shared_logic.views import View

GAP = 1800
#: Sessions a user keeps in the bounded view; older ones are folded.
KEEP = 2


class PageView(EventModel):
    user: str
    page: str
    seconds: int
    event_time: datetime | None = None


class Visits(Pipeline):
    name = "visits"
    event_model = PageView
    views = (
        View("visits", keys=("user",), measures=(Count(), Sum("seconds"), Min("seconds"), Max("seconds")),
             sessions=SessionWindow(timedelta(seconds=GAP)), description="Each user's visits (30-minute gap)."),
        View("visits_bounded", keys=("user",), measures=(Count(),),
             sessions=SessionWindow(timedelta(seconds=GAP), max_sessions=KEEP),
             description="Each user's visits, the newest two kept, older ones folded."),
        View("pages_seen", keys=("user",), measures=(Count(), Distinct("page")), description="Pages per user."),
    )

    def transform(self, events: DataFrame) -> DataFrame:
        return events


pipeline = Visits()
