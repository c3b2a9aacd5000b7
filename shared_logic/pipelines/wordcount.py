"""The classic word count: words split on ASCII whitespace, case kept as written."""

from __future__ import annotations

from datetime import datetime, timedelta

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from shared_logic.measures import Count
from shared_logic.pipeline import EventModel, Pipeline
from shared_logic.views import TumblingWindow, View


class Line(EventModel):
    text: str
    event_time: datetime | None = None


class WordCount(Pipeline):
    name = "wordcount"
    event_model = Line
    views = (
        View("word_counts", keys=("word",), measures=(Count(),), description="Occurrences of each word."),
        View(
            "word_counts_per_minute",
            keys=("word",),
            measures=(Count(),),
            window=TumblingWindow(timedelta(minutes=1)),
            description="Occurrences of each word per 1-minute event-time window.",
        ),
    )

    def transform(self, events: DataFrame) -> DataFrame:
        # Java's \s is ASCII whitespace: [ \t\n\x0B\f\r]. Empty strings come from leading whitespace.
        words = F.explode(F.split(F.col("text"), r"\s+")).alias("word")
        return events.select(words, F.col("event_time")).where(F.col("word") != "")


pipeline = WordCount()
