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
counts and sums). Before each timed run it waits (bounded) for the machine to quiet down. The
script prints the median seconds of each, events/s, the CPU seconds of the benchmark's processes
(driver, JVM, Python workers; not the daemonized Redis) and delta-spark / delta-rs by both.

Usage:
    .venv/bin/python benchmarks/engines_bench.py --events 1000000 --repeat 2
    .venv/bin/python benchmarks/engines_bench.py --events 200000 --repeat 1      # quick
"""

from __future__ import annotations

import argparse
import contextlib
import math
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from _batch_data import build_master
from _harness import embedded_redis, print_medians, tree_cpu_seconds, wait_quiet

ENGINES = ("delta-rs", "delta-spark")


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
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--shuffle-partitions", type=int, default=8)
    parser.add_argument("--driver-memory", default="6g")
    parser.add_argument("--quiet-cores", type=float, default=0.3, help="before each run, wait until other processes "
                        "use fewer cores than this (at most --quiet-timeout s)")
    parser.add_argument("--quiet-timeout", type=float, default=30.0)
    parser.add_argument("--data-dir", type=Path, default=None)
    args = parser.parse_args(argv)

    from deploy.settings import load_settings
    from shared_logic import load_pipeline

    root = Path(tempfile.mkdtemp(prefix="lp-engines-")) if args.data_dir is None else args.data_dir.resolve()
    pipeline = load_pipeline("payments")
    common = {"pipeline": "payments", "spark_shuffle_partitions": args.shuffle_partitions,
              "spark_driver_memory": args.driver_memory}
    all_settings = {e: load_settings(data_dir=root / e, storage_engine=e, **common) for e in ENGINES}
    try:
        files, took = build_master(all_settings["delta-rs"], pipeline, args, args.events)
        shutil.copytree(all_settings["delta-rs"].master_path, all_settings["delta-spark"].master_path)
        print(f"master: {args.events:,} events in {files} files ({took:.1f}s), "
              f"{args.users:,} users; copied for the second engine", flush=True)
        with contextlib.ExitStack() as stack:
            urls = {e: stack.enter_context(embedded_redis(s.redis_dir)) for e, s in all_settings.items()}
            _rotation(args, all_settings, pipeline, urls)
    finally:
        if args.data_dir is None:
            shutil.rmtree(root, ignore_errors=True)
    return 0


def _rotation(args: argparse.Namespace, all_settings: dict[str, Any], pipeline: Any, urls: dict[str, str]) -> None:
    """One SparkSession with JVM Delta loaded serves both engines; rs jvm rs jvm ... after a warm-up each."""
    from batch_layer.recompute.job import run_batch
    from deploy.runtime.spark import build_spark

    started = time.perf_counter()
    spark = build_spark(all_settings["delta-spark"], "bench-engines")
    print(f"SparkSession up in {time.perf_counter() - started:.1f}s ({spark.sparkContext.master}, "
          f"shuffle partitions {args.shuffle_partitions})", flush=True)
    seconds: dict[str, list[float]] = {e: [] for e in ENGINES}
    cpu: dict[str, list[float]] = {e: [] for e in ENGINES}
    for round_ in range(args.repeat + 1):
        for engine in ENGINES:
            if round_:
                wait_quiet(tree_cpu_seconds, args.quiet_cores, args.quiet_timeout)
            cpu0, began = tree_cpu_seconds(), time.perf_counter()
            result = run_batch(spark, all_settings[engine], pipeline, redis_url=urls[engine])
            took, used = time.perf_counter() - began, tree_cpu_seconds() - cpu0
            assert result.events == args.events, (engine, result.events)
            label = "warm-up" if round_ == 0 else f"round {round_}"
            print(f"  {label:8} {engine:11} {took:7.2f}s  CPU {used:6.1f}s  generation {result.generation}", flush=True)
            if round_:
                seconds[engine].append(took)
                cpu[engine].append(used)
        if round_ == 0:
            check_same_gold(all_settings)
    med = print_medians(f"batch recompute of {args.events:,} payments events (run_batch incl. Redis), "
                        f"{spark.sparkContext.master}", seconds, baseline="delta-rs", per_second=args.events)
    cpu_med = {e: statistics.median(c) for e, c in cpu.items()}
    print(f"  delta-spark / delta-rs = {med['delta-spark'] / med['delta-rs']:.2f} by wall seconds, "
          f"{cpu_med['delta-spark'] / cpu_med['delta-rs']:.2f} by CPU seconds of this process and its children "
          f"(median CPU s: delta-rs {cpu_med['delta-rs']:.1f}, delta-spark {cpu_med['delta-spark']:.1f})", flush=True)
    spark.stop()


if __name__ == "__main__":
    raise SystemExit(main())
