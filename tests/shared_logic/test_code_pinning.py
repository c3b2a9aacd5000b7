"""Spark's workers run a pipeline's UDFs as the driver imported (and fingerprinted) them, not the file on disk.

A pipeline module with a Python UDF is imported, then its file is rewritten (an edit while the
platform runs); the transform's rows must still come from the imported code. Shipped by name,
a worker would import the module itself: the new code, or (here, the module not being on the
workers' path) no module at all.
"""

from __future__ import annotations

import importlib
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

SOURCE = '''
from datetime import datetime

from pyspark.sql import functions as F
from pyspark.sql import types as T

from shared_logic.measures import Count
from shared_logic.pipeline import EventModel, Pipeline
from shared_logic.views import View


class Line(EventModel):
    text: str
    event_time: datetime | None = None


def _tag(text):
    return "TAG:" + text


class Tagged(Pipeline):
    name = "tagged"
    event_model = Line
    views = (View("tags", keys=("tag",), measures=(Count(),)),)

    def transform(self, events):
        return events.select(F.udf(_tag, T.StringType())(F.col("text")).alias("tag"), "event_time")


pipeline = Tagged()
'''


def test_workers_run_the_imported_code_after_the_file_changed(spark: Any, tmp_path: Path) -> None:
    name = f"pinned_{tmp_path.name}".replace("-", "_")
    (tmp_path / f"{name}.py").write_text(SOURCE.replace("TAG:", "v1:"))
    sys.path.insert(0, str(tmp_path))  # the driver's path only: Spark's Python workers do not see it
    try:
        pipeline = importlib.import_module(name).pipeline
        (tmp_path / f"{name}.py").write_text(SOURCE.replace("TAG:", "v2:"))  # edited on disk meanwhile
        events = spark.createDataFrame([("apache", datetime(2024, 3, 1, tzinfo=timezone.utc)), ("spark", None)],
                                       "text string, event_time timestamp")
        tags = sorted(row["tag"] for row in pipeline.transform(events).collect())
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop(name, None)
    assert tags == ["v1:apache", "v1:spark"]
