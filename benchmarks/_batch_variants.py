"""The batch benchmark's variants (A run_batch, B hand-written Spark SQL, C the recompute without Redis)
and the untimed check of their outputs after the warm-up."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

from _batch_steps import STEPS

_MEASURES = """
    count(*)                           AS count,
    coalesce(sum(amount), 0D)          AS sum_amount,
    min(amount)                        AS min_amount,
    max(amount)                        AS max_amount,
    collect_set(merchant)              AS distinct_merchant
"""
HAND_SQL = {
    "spend_by_user": f"""
        SELECT user_id, {_MEASURES}
        FROM bench_payments
        WHERE user_id IS NOT NULL
        GROUP BY user_id""",
    "spend_by_user_hourly": f"""
        SELECT user_id, date_trunc('HOUR', event_time) AS window_start, {_MEASURES}
        FROM bench_payments
        WHERE user_id IS NOT NULL AND event_time IS NOT NULL
        GROUP BY user_id, date_trunc('HOUR', event_time)""",
}


def variant_a(spark: Any, settings: Any, pipeline: Any, redis_url: str) -> dict[str, Any]:
    from batch_layer.recompute.job import run_batch

    result = run_batch(spark, settings, pipeline, redis_url=redis_url)
    return {"generation": result.generation, "events": result.events, "rows": dict(result.view_rows),
            "flipped": result.flipped}


def variant_b(spark: Any, settings: Any, out_dir: Path) -> dict[str, Any]:
    """The hand-written job: list the snapshot's files, run two SQL aggregates, write parquet."""
    from deltalake import DeltaTable

    started = time.perf_counter()
    files = DeltaTable(str(settings.master_path)).file_uris()
    spark.read.parquet(*files).createOrReplaceTempView("bench_payments")
    STEPS.add("1 file list + Spark plan", time.perf_counter() - started)
    for name, sql in HAND_SQL.items():
        began = time.perf_counter()
        spark.sql(sql).write.mode("overwrite").parquet(str(out_dir / name))
        STEPS.add(f"3 {name}: SQL + write parquet", time.perf_counter() - began)
    return {"files": len(files)}


def variant_c(spark: Any, settings: Any, pipeline: Any) -> dict[str, Any]:
    """run_batch minus Redis: barrier, snapshot, event count, then per view the checked rows (the poison
    screen's ``view_rows``: the transform with its measure-input check, as run_batch reads them) aggregated
    and written as gold."""
    from batch_layer.master.dataset import MasterDataset
    from batch_layer.recompute import job as recompute
    from batch_layer.recompute.poison import Screen

    master = MasterDataset.open(settings, pipeline)
    engine = master.engine
    generation = master.append_barrier(f"bench-{uuid.uuid4().hex[:8]}")
    events = master.snapshot(spark, generation)
    count = events.count()
    screen = Screen(pipeline, events)
    written = {}
    for view in pipeline.views:
        gold = screen.compute(lambda rows, view=view: recompute.write_generation(
            view.aggregate(rows), settings.gold_path / view.name, engine, generation=generation))
        written[view.name] = gold.rows
    return {"generation": generation, "events": count, "rows": written}


# --------------------------------------------------------------------------------------------
# Checks (untimed, after the warm-up)
# --------------------------------------------------------------------------------------------


def verify(spark: Any, settings: Any, pipeline: Any, b_out: Path, a_result: dict[str, Any], redis_url: str,
           events: int) -> list[str]:
    """Gold (current content) == B's output row by row; Redis hashes hold as many fields as gold rows."""
    from deltalake import DeltaTable
    from pyspark.sql import functions as F

    from serving.store.keys import Keys
    from serving.store.row_format import row_parts

    problems = []
    if a_result["events"] != events:
        problems.append(f"run_batch counted {a_result['events']} events, generated {events}")
    for view in pipeline.views:
        gold = spark.read.parquet(*DeltaTable(str(settings.gold_path / view.name)).file_uris())
        hand = spark.read.parquet(str(b_out / view.name))
        joined = gold.alias("g").join(hand.alias("h"), list(view.group_columns), "full_outer")
        g, h = (lambda c: F.col(f"g.{c}")), (lambda c: F.col(f"h.{c}"))
        differs = (
            (g("count") != h("count"))
            | (F.abs(g("sum_amount") - h("sum_amount")) > 1e-6 * F.greatest(F.lit(1.0), F.abs(h("sum_amount"))))
            | (g("min_amount") != h("min_amount"))
            | (g("max_amount") != h("max_amount"))
            | (F.array_sort(g("distinct_merchant")) != F.array_sort(h("distinct_merchant")))
        )
        bad = joined.where(F.coalesce(differs, F.lit(True))).count()
        gold_rows, hand_rows = gold.count(), hand.count()
        if bad or gold_rows != hand_rows:
            problems.append(f"{view.name}: gold {gold_rows} rows, hand-written {hand_rows} rows, {bad} differ")
    # Redis: A's generation is served with one row per gold row, and each row's merchants are there
    # once: as an exact list in the row, or as a sketch key.
    from serving.store.connection import redis_client
    from serving.store.session import PipelineStore

    client = redis_client(redis_url)
    keys = Keys(pipeline.name)
    generation = a_result["generation"]
    served = PipelineStore(client, keys).served_generation()
    if served != generation:
        problems.append(f"Redis serves generation {served}, run_batch published {generation}")
    for view in pipeline.views:
        hashes = list(client.scan_iter(match=keys.rows(generation, view.name) + "*", count=10_000))
        rows = sum(client.hlen(k) for k in hashes)
        if rows != a_result["rows"][view.name]:
            problems.append(f"Redis {view.name}: {rows} rows for {a_result['rows'][view.name]} gold rows")
        for measure in view.distinct_measures:
            pattern = keys.sketch(generation, view.name, measure.name, "*")
            sketches = sum(1 for _ in client.scan_iter(match=pattern, count=10_000))
            position = row_parts(view).index(measure.name)
            exact = sum(1 for k in hashes for _, row in client.hscan_iter(k, count=10_000)
                        if json.loads(row)[position] is not None)
            if sketches + exact != rows:
                problems.append(f"Redis {view.name}: {exact} exact {measure.name} lists and {sketches} sketches "
                                f"for {rows} rows")
    client.close()
    return problems

