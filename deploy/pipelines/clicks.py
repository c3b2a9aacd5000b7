"""An example user pipeline for the cluster recipes (LAMBDA_PIPELINE=clicks): page views per site section.

Compose mounts this folder at /pipelines (on the image's PYTHONPATH); on Kubernetes it is the
ConfigMap ``lambda-pipeline`` (``kubectl create configmap lambda-pipeline --from-file=deploy/pipelines/``).
The driver ships it to the executors with the job: the Spark workers need no copy.
"""

from __future__ import annotations

from datetime import datetime

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from shared_logic import Count, EventModel, Pipeline, Sum, View


class Click(EventModel):
    page: str
    ms_on_page: int
    event_time: datetime | None = None


class Clicks(Pipeline):
    name = "clicks"
    event_model = Click
    views = (View("page_views", keys=("section",), measures=(Count(), Sum("ms_on_page"))),)

    def transform(self, events: DataFrame) -> DataFrame:
        return events.withColumn("section", F.split("page", "/").getItem(1))


pipeline = Clicks()
