"""The batch benchmark's bookkeeping around each run (Redis's background work, its CPU) and the report:
medians, A/B, C/B, A-C, A/D and where the time of each variant goes."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any

TARGET_A_OVER_B = 1.15


def redis_info(url: str) -> dict[str, Any]:
    from serving.store.connection import redis_client

    client = redis_client(url)
    try:
        return client.info()
    finally:
        client.close()


def redis_cpu(info: dict[str, Any]) -> float:
    """CPU seconds of the Redis server: main process and its children (AOF rewrite forks)."""
    return sum(float(info.get(k, 0.0)) for k in
               ("used_cpu_sys", "used_cpu_user", "used_cpu_sys_children", "used_cpu_user_children"))


def settle(spark: Any, redis_url: str, timeout: float = 300.0) -> float:
    """Let the previous variant's background work finish before the next one is timed: Redis AOF
    rewrites and lazy frees (UNLINK) left by A, Python and JVM garbage. Returns the seconds waited."""
    import gc

    started = time.perf_counter()
    gc.collect()
    spark.sparkContext._jvm.System.gc()
    while time.perf_counter() - started < timeout:
        info = redis_info(redis_url)
        busy = (int(info.get("aof_rewrite_in_progress", 0)) or int(info.get("aof_rewrite_scheduled", 0))
                or int(info.get("lazyfree_pending_objects", 0)) or int(info.get("rdb_bgsave_in_progress", 0)))
        if not busy:
            break
        time.sleep(0.1)
    return time.perf_counter() - started


@dataclass
class Variant:
    key: str
    title: str
    seconds: list[float] = field(default_factory=list)
    steps: list[dict[str, float]] = field(default_factory=list)



def report(args: argparse.Namespace, spark: Any, settings: Any, events: int, files: int,
           variants: dict[str, Variant], results: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Print the report of one event count; returns its headline figures (medians, ratios, CPU)."""
    med = {k: statistics.median(v.seconds) for k, v in variants.items()}
    a_b, c_b = med["A"] / med["B"], med["C"] / med["B"]
    rows = ", ".join(f"{name} {n:,}" for name, n in results["A"]["rows"].items())
    print()
    print(f"=== batch recompute, {events:,} events ({files} master files; gold rows: {rows}) ===")
    print(f"Spark {spark.version}, master {settings.spark_master} (defaultParallelism "
          f"{spark.sparkContext.defaultParallelism}, {os.cpu_count()} CPUs), "
          f"spark.sql.shuffle.partitions={spark.conf.get('spark.sql.shuffle.partitions')}, "
          f"AQE={spark.conf.get('spark.sql.adaptive.enabled')}, driver memory {settings.spark_driver_memory}; "
          f"median of {args.repeat} timed runs after 1 warm-up, order {' '.join(variants)} repeated")
    own_label = "9.05 (CPU seconds used by this benchmark: driver, JVM, Python workers, Redis)"
    cpu = {k: statistics.median(steps.get(own_label, 0.0) for steps in v.steps) for k, v in variants.items()}
    print(f"{'variant':<60}{'median s':>10}{'events/s':>13}{'CPU s':>9}   runs (s)")
    for v in variants.values():
        runs = " ".join(f"{s:.2f}" for s in v.seconds)
        print(f"{v.title:<60}{med[v.key]:>10.2f}{events / med[v.key]:>13,.0f}{cpu[v.key]:>9.1f}   {runs}")
    verdict = "MET" if a_b <= TARGET_A_OVER_B else "NOT MET"
    def cpu_ratio(k: str) -> str:
        return f"{cpu[k] / cpu['B']:.2f}" if cpu["B"] else "n/a"

    print(f"A/B = {a_b:.2f}   (target A/B <= {TARGET_A_OVER_B}: {verdict}; by CPU seconds: {cpu_ratio('A')})")
    print(f"C/B = {c_b:.2f}   (framework overhead on the Spark work, Redis excluded; by CPU seconds: {cpu_ratio('C')})")
    print(f"A-C = {med['A'] - med['C']:.2f}s  (Redis publishing: load_view x {len(results['A']['rows'])}, "
          f"begin/flip/drop_stale)")
    if "D" in med:
        print(f"A/D = {med['A'] / med['D']:.2f}   (ours / the peer a user would otherwise build: Spark SQL -> Redis with "
              f"HSET pipelines, no generations, no flip; by CPU seconds: {cpu['A'] / cpu['D'] if cpu['D'] else float('nan'):.2f}; "
              f"D/B = {med['D'] / med['B']:.2f})")
    other_label = "9.06 (CPU seconds used by OTHER processes on the machine during the run)"
    others = sum(steps.get(other_label, 0.0) for v in variants.values() for steps in v.steps)
    wall = sum(sum(v.seconds) for v in variants.values())
    shared = others / wall if wall else 0.0
    print(f"other processes on the machine used {shared:.2f} cores on average during the timed runs"
          + (f" -- WARNING: the machine was shared ({os.cpu_count()} CPUs); wall times are inflated and noisy"
             if shared > args.quiet_cores else " (quiet machine)"))
    print("where the time goes (median seconds per step over the timed runs; indented steps are parts of "
          "the step above; in parentheses: measured alongside, not part of the wall time):")
    for v in variants.values():
        labels = sorted({label for steps in v.steps for label in steps})
        print(f"  {v.title}")
        accounted = [0.0] * len(v.steps)
        extra = []
        for label in labels:
            values = [steps.get(label, 0.0) for steps in v.steps]
            number, text = label.split(" ", 1)
            if number.startswith("9."):
                extra.append((text, statistics.median(values)))
                continue
            if "." not in number:
                accounted = [a + x for a, x in zip(accounted, values)]
            print(f"    {text:<72}{statistics.median(values):>8.2f}{100 * statistics.median(values) / med[v.key]:>6.0f}%")
        rest = statistics.median([s - a for s, a in zip(v.seconds, accounted)])
        print(f"    {'rest (driver glue, untimed)':<72}{rest:>8.2f}{100 * rest / med[v.key]:>6.0f}%")
        for text, value in extra:
            print(f"    {text:<72}{value:>8.2f}")
    sys.stdout.flush()
    figures = {"events": events, "a_seconds": med["A"], "b_seconds": med["B"], "c_seconds": med["C"],
               "a_over_b": a_b, "c_over_b": c_b, "a_minus_c": med["A"] - med["C"],
               "a_over_b_cpu": cpu["A"] / cpu["B"] if cpu["B"] else float("nan"), "others_cores": shared,
               "repeat": args.repeat}
    if "D" in med:
        figures.update({"d_seconds": med["D"], "a_over_d": med["A"] / med["D"],
                        "a_over_d_cpu": cpu["A"] / cpu["D"] if cpu["D"] else float("nan")})
    return figures

