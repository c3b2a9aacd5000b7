"""Flight events for the composite-key test pipeline (``tests.support.flights_pipeline``), their pandas
oracle, and the speed layer's own write of a realtime segment of them."""

from __future__ import annotations

import functools
import random
from datetime import datetime, timedelta, timezone
from typing import Any

import pandas as pd
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from deploy.settings import Settings
from serving.store.connection import redis_client, store_keys
from serving.store.session import PipelineStore
from shared_logic.registry import load_pipeline
from speed_layer.segments import DEPTH, WriteSpec, encode, measure_spec, write_increments

PIPELINE = "tests.support.flights_pipeline"
START = datetime(2024, 3, 1, 9, 0, tzinfo=timezone.utc)
AIRPORTS = ["JFK", "LAX", "SFO", "ORD", "JAX", "X|Y", "B\\S", "Ünï"]
ALL, HOURLY = "flights_by_route", "flights_by_route_hourly"


def flights(rng: random.Random, n: int, airports: list[str]) -> list[dict[str, Any]]:
    return [{"origin": rng.choice(airports), "dest": rng.choice(airports), "delay": rng.randint(-5, 90),
             "event_time": (START + timedelta(seconds=rng.randrange(6 * 3600))).isoformat()} for _ in range(n)]


def encoded(*values: str) -> str:
    return "|".join(v.replace("\\", "\\\\").replace("|", "\\|") for v in values)


def oracle(events: list[dict[str, Any]], hourly: bool = False) -> dict[tuple[str, int | None], dict[str, int]]:
    """(encoded key, window start or None) -> the measures, by pandas."""
    frame = pd.DataFrame(events)
    frame["key"] = [encoded(o, d) for o, d in zip(frame["origin"], frame["dest"])]
    frame["ws"] = (pd.to_datetime(frame["event_time"]).astype("int64") // 10**9 // 3600 * 3600) if hourly else -1
    grouped = frame.groupby(["key", "ws"])["delay"].agg(["size", "sum", "max"])
    return {(k, None if ws == -1 else int(ws)): {"count": int(c), "sum_delay": int(s), "max_delay": int(m)}
            for (k, ws), (c, s, m) in grouped.iterrows()}


def write_realtime(spark: Any, settings: Settings, base: int, events: list[dict[str, Any]], last: int,
                   batch_id: int = 0) -> None:
    """The speed layer's write of ``events`` into the segment based at ``base`` as micro-batch ``batch_id``,
    committed at version ``last``."""
    pipeline = load_pipeline(settings.pipeline)
    store = PipelineStore(redis_client(settings.redis_url), store_keys(pipeline.name, settings.redis_url))
    frame = spark.createDataFrame(
        [(e["origin"], e["dest"], e["delay"], datetime.fromisoformat(e["event_time"])) for e in events],
        "origin string, dest string, delay long, event_time timestamp")
    rows = pipeline.transform(frame)
    parts = [encode(view.aggregate(rows).withColumn(DEPTH, F.lit(1)), view, (3, 0)) for view in pipeline.views]
    spec = WriteSpec(settings.redis_url, pipeline.name, "test-speed", store.read_epoch() or "", batch_id, last, (base,),
                     {view.name: measure_spec(view) for view in pipeline.views}, 500)
    write_increments(functools.reduce(DataFrame.unionByName, parts), spec, partitions=2)
    store.commit_processed([base], last)
    store.client.close()
