#!/usr/bin/env python
"""Benchmark: the full batch recompute on the delta-spark engine against the delta-rs engine.

One synthetic payments master dataset (as ``batch_recompute.py`` builds it: appended by delta-rs in
chunks, several files) is copied so each engine has its own identical master, gold tables and
embedded Redis. Then, in ONE SparkSession with JVM Delta loaded, ``run_batch`` runs on each engine
in rotation (rs jvm rs jvm ...), after one untimed warm-up each:

  rs   delta-rs engine: barrier by delta-rs, snapshot by Spark's parquet reader over delta-rs's
       file list, gold as Spark-written parquet committed by delta-rs, Redis load, flip.
  jvm  delta-spark engine: barrier by JVM Delta, snapshot ``versionAsOf``, gold written by JVM
       Delta (``txnAppId``/``txnVersion``), Redis load, flip.

After the warm-up both engines' gold tables are read back with delta-rs and compared (same keys,
counts and sums). The script prints the median seconds of each, events/s, and jvm/rs.

Usage:
    .venv/bin/python benchmarks/engines_bench.py --events 1000000 --repeat 2
    .venv/bin/python benchmarks/engines_bench.py --events 200000 --repeat 1      # quick
"""

from __future__ import annotations

import argparse
import math
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _batch_data import event_chunks

ENGINES = ("delta-rs", "delta-spark")


def build_master(settings: Any, pipeline: Any, args: argparse.Namespace) -> int:
    """Append the synthetic dataset with delta-rs; returns the number of files."""
    from deltalake import DeltaTable

    from batch_layer.master.dataset import MasterDataset
    from batch_layer.master.engines import get_engine

    master = MasterDataset(settings.master_path, pipeline, get_engine("delta-rs"))
    chunk = max(1, min(args.chunk_rows, -(-args.events // args.min_files)))
    for rows in event_chunks(master.schema, args.events, users=args.users, merchants=args.merchants,
                             chunk_rows=chunk, seed=7):
        master.append(rows, metadata={"lambda.source": "benchmark"})
    return len(DeltaTable(str(settings.master_path)).file_uris())


def gold_summary(settings: Any, view: str) -> dict[str, tuple[int, float]]:
    """key -> (count, sum) of the gold table's current content, read with delta-rs."""
    from deltalake import DeltaTable

    rows = DeltaTable(str(settings.gold_path / view)).to_pyarrow_table(columns=["user_id", "count", "sum_amount"])
    return {r["user_id"]: (r["count"], r["sum_amount"]) for r in rows.to_pylist()}


def check_same_gold(all_settings: dict[str, Any]) -> None:
    left, right = (gold_summary(all_settings[e], "spend_by_user") for e in ENGINES)
    assert left.keys() == right.keys(), "the engines' gold tables hold different keys"
    for key, (count, total) in left.items():
        other = right[key]
        assert count == other[0] and math.isclose(total, other[1], rel_tol=1e-9), (key, left[key], other)
    print(f"gold checked: {len(left):,} users, same counts and sums on both engines", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--users", type=int, default=50_000)
    parser.add_argument("--merchants", type=int, default=200)
    parser.add_argument("--chunk-rows", type=int, default=1_000_000)
    parser.add_argument("--min-files", type=int, default=4)
    parser.add_argument("--shuffle-partitions", type=int, default=8)
    parser.add_argument("--driver-memory", default="6g")
    parser.add_argument("--data-dir", type=Path, default=None)
    args = parser.parse_args(argv)

    from batch_layer.recompute.job import run_batch
    from deploy.redis_server import ensure_embedded_redis, stop_embedded_redis
    from deploy.settings import load_settings
    from deploy.spark import build_spark
    from shared_logic import load_pipeline

    root = Path(tempfile.mkdtemp(prefix="lp-engines-")) if args.data_dir is None else args.data_dir.resolve()
    pipeline = load_pipeline("payments")
    common = {"pipeline": "payments", "spark_shuffle_partitions": args.shuffle_partitions,
              "spark_driver_memory": args.driver_memory}
    all_settings = {e: load_settings(data_dir=root / e, storage_engine=e, **common) for e in ENGINES}
    urls: dict[str, str] = {}
    try:
        started = time.perf_counter()
        files = build_master(all_settings["delta-rs"], pipeline, args)
        shutil.copytree(all_settings["delta-rs"].master_path, all_settings["delta-spark"].master_path)
        print(f"master: {args.events:,} events in {files} files ({time.perf_counter() - started:.1f}s), "
              f"{args.users:,} users; copied for the second engine", flush=True)
        started = time.perf_counter()
        spark = build_spark(all_settings["delta-spark"], "bench-engines")  # JVM Delta loaded; serves both
        print(f"SparkSession up in {time.perf_counter() - started:.1f}s ({spark.sparkContext.master}, "
              f"shuffle partitions {args.shuffle_partitions})", flush=True)
        urls = {e: ensure_embedded_redis(s.redis_dir) for e, s in all_settings.items()}

        seconds: dict[str, list[float]] = {e: [] for e in ENGINES}
        for round_ in range(args.repeat + 1):
            for engine in ENGINES:
                began = time.perf_counter()
                result = run_batch(spark, all_settings[engine], pipeline, redis_url=urls[engine])
                took = time.perf_counter() - began
                assert result.events == args.events, (engine, result.events)
                label = "warm-up" if round_ == 0 else f"round {round_}"
                print(f"  {label:8} {engine:11} {took:7.2f}s  generation {result.generation}", flush=True)
                if round_:
                    seconds[engine].append(took)
            if round_ == 0:
                check_same_gold(all_settings)

        medians = {e: statistics.median(s) for e, s in seconds.items()}
        print(f"\nbatch recompute of {args.events:,} payments events (run_batch incl. Redis), median of {args.repeat}:")
        for engine in ENGINES:
            print(f"  {engine:11} {medians[engine]:7.2f}s  {args.events / medians[engine]:>12,.0f} events/s")
        print(f"  delta-spark / delta-rs = {medians['delta-spark'] / medians['delta-rs']:.2f}")
        spark.stop()
    finally:
        for engine in urls:
            stop_embedded_redis(all_settings[engine].redis_dir)
        if args.data_dir is None:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
