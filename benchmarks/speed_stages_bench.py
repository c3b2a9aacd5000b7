"""Where a speed-layer micro-batch's time goes, stage by stage, against Spark's aggregation alone.

    .venv/bin/python benchmarks/speed_stages_bench.py [--users 50000 --events 500000 --writes 3]

No stream: the events of one micro-batch (the payments pipeline, ``--users`` users over 24 hours) are
ingested into a master dataset and read back as one static DataFrame, then each stage of the speed
layer's write is added to the one before and timed in the same process and session:

1. the views' aggregation alone, written nowhere (the speed-layer throughput benchmark's baseline;
   run three times: the JVM warms up over the first two, the third is the reference);
2. + the encoding into the write's shape and the union of the views (``segments.encode``);
3. + the hash partitioning by row and the sort, handed to Python workers as Arrow, which drop it;
4. + the speed layer's write (``segments.write_increments``: rows read, merged in Python, stored by
   the guarded Lua call), ``--writes`` times as consecutive micro-batches updating the same rows,
   with Redis's CPU for each.

The difference between consecutive lines is a stage's share. Nothing is asserted; figures are printed.
"""

from __future__ import annotations

import argparse
import functools
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _harness import git_commit
from speed_layer_bench import payments_table

from batch_layer.master.dataset import MasterDataset
from batch_layer.master.engines import get_engine
from batch_layer.recompute.job import run_batch
from deploy.runtime.redis_server import ensure_embedded_redis, stop_embedded_redis
from deploy.settings import load_settings
from serving.store.connection import redis_client, store_keys
from serving.store.session import PipelineStore
from shared_logic import load_pipeline
from speed_layer import segments


def _dropped(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    rows = sum(b.num_rows for b in batches)
    yield pa.RecordBatch.from_pydict({"rows": [rows]}, schema=pa.schema([("rows", pa.int64())]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=50_000)
    parser.add_argument("--events", type=int, default=500_000, help="events of the micro-batch (default 500k)")
    parser.add_argument("--writes", type=int, default=3, help="consecutive writes of the same rows (default 3)")
    args = parser.parse_args()
    if min(args.users, args.events, args.writes) < 1:
        parser.error("--users, --events and --writes each take a number of at least 1")
    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema

    from deploy.runtime.spark import build_spark

    head, dirty = git_commit("speed_layer", "serving")
    print(f"speed-layer stages: {args.events:,} events, {args.users:,} users; commit {head}"
          f"{' + uncommitted ' + ', '.join(dirty) if dirty else ''}")
    with tempfile.TemporaryDirectory(prefix="speed-stages-") as tmp:
        settings = load_settings(data_dir=Path(tmp), pipeline="payments", spark_driver_memory="6g")
        redis_url = ensure_embedded_redis(settings.redis_dir)
        pipeline = load_pipeline("payments")
        master = MasterDataset(settings.master_path, pipeline, get_engine("delta-rs"))
        rng = np.random.default_rng(3)
        spark = build_spark(settings, "bench-speed-stages")
        try:
            master.append(payments_table(pipeline, 1000, rng))
            run_batch(spark, settings, pipeline, redis_url=redis_url)
            master.append(payments_table(pipeline, args.events, rng, args.users))
            from deltalake import DeltaTable

            files = DeltaTable(str(settings.master_path)).file_uris()
            client = redis_client(redis_url)
            keys = store_keys(pipeline.name, redis_url)
            epoch, served = PipelineStore(client, keys).ensure_epoch(), int(client.get(keys.current) or 0)

            def events() -> DataFrame:
                rows = spark.read.schema(from_arrow_schema(master.schema)).parquet(*files).where("_kind = 'event'")
                return pipeline.transform(rows.drop("_kind"))

            width = (max(len(v.scalar_measures) for v in pipeline.views),
                     max(len(v.distinct_measures) for v in pipeline.views))

            def encoded() -> DataFrame:
                rows = events()
                return functools.reduce(DataFrame.unionByName, [
                    segments.encode(v.aggregate(rows).withColumn(segments.DEPTH, F.lit(1)), v, width)
                    for v in pipeline.views])

            def aggregate() -> None:
                rows = events()
                for view in pipeline.views:
                    view.aggregate(rows).write.format("noop").mode("overwrite").save()

            def encode() -> None:
                encoded().write.format("noop").mode("overwrite").save()

            def hand_over() -> int:
                order = (segments.VIEW, segments.KEY, segments.WS)
                stable = encoded().repartition(2, *order).sortWithinPartitions(*order, segments.DEPTH)
                return sum(r.rows for r in stable.mapInArrow(_dropped, "rows long").collect())

            def write(batch: int) -> int:
                spec = segments.WriteSpec(redis_url, pipeline.name, "stages", epoch, batch, 10**9 + batch, (served,),
                                          {v.name: segments.measure_spec(v) for v in pipeline.views}, 2000)
                return segments.write_increments(encoded(), spec, 2).rows

            def cpu() -> float:
                info = client.info("cpu")
                return float(info["used_cpu_user"] + info["used_cpu_sys"])

            stages: list[tuple[str, Callable[[], object]]] = [
                ("aggregation alone (cold JVM)", aggregate), ("aggregation alone (warming up)", aggregate),
                ("aggregation alone", aggregate),
                ("+ encoding, union", encode), ("+ partitioning, sort, Arrow to Python", hand_over),
                *((f"+ the write, micro-batch {b + 1}", functools.partial(write, b)) for b in range(args.writes))]
            baseline = None
            for name, stage in stages:
                before, started = cpu(), time.perf_counter()
                rows = stage()
                seconds = time.perf_counter() - started
                baseline = seconds if name == "aggregation alone" else baseline
                ratio = f"  x{seconds / baseline:4.2f} of the aggregation" if baseline else ""
                written = f"  ({rows:,} view rows)" if isinstance(rows, int) else ""
                print(f"  {name:<40} {seconds:6.2f} s  Redis CPU {cpu() - before:6.2f} s{ratio}{written}", flush=True)
            client.close()
        finally:
            spark.stop()
            stop_embedded_redis(settings.redis_dir)


if __name__ == "__main__":
    main()
