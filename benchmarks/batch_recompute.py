#!/usr/bin/env python
"""Benchmark: the platform's full batch recompute against a hand-written Spark SQL job.

For each event count it builds a payments master dataset (synthetic, generated as Arrow and
appended with ``MasterDataset.append`` in chunks, so the table has several files), then, in one
process and one SparkSession, times these variants in rotation (A B C A B C ...), so that drift
(JIT, page cache, GC, thermal) hits every variant alike:

  A  ``run_batch``: the full recompute (barrier append, Spark snapshot read, shared transform,
     views aggregate, gold Delta write + commit, Redis load, flip, drop of the stale generation).
  B  a hand-written Spark SQL job over the SAME snapshot parquet files
     (``deltalake.DeltaTable(master).file_uris()``): the same aggregates per user and per user
     and 1-hour window (count, sum, min, max, collect_set(merchant)), written as parquet.
  C  the recompute's compute + gold part without Redis: barrier append, snapshot,
     ``write_generation(view.aggregate(pipeline.transform(snapshot)))`` per view, and the event
     count ``run_batch`` computes for its metadata. A - C is the Redis publishing cost; C / B
     is the framework's overhead on the Spark work.

Every variant runs once untimed (warm-up) before the timed repeats; after the warm-up the gold
tables and B's output are compared row by row, and Redis is checked to serve A's generation with
every gold row's distinct values (exact or sketched). Before every run the benchmark lets Redis finish A's background work
(AOF rewrite, lazy free), collects garbage, and waits (bounded) for other processes on the
machine to quiet down. The script prints, per event count, the median seconds of each variant,
A/B and C/B (target: A/B <= 1.15), events per second, CPU seconds, and where the time of each
variant goes (wall-clock of each step, measured by wrapping the platform's functions in this
process; nothing in the product is changed).

Usage:
    .venv/bin/python benchmarks/batch_recompute.py                       # 1M and 10M events
    .venv/bin/python benchmarks/batch_recompute.py --events 1000000 --repeat 2
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import pyarrow as pa

TARGET_A_OVER_B = 1.15
DAY_US = 86_400 * 1_000_000
START = datetime(2026, 1, 1, tzinfo=timezone.utc)

log = logging.getLogger("bench")


# --------------------------------------------------------------------------------------------
# Step timing: wrap platform functions (in this process only) and add their wall-clock time to
# the active recording. Labels are ordered by their leading number when printed.
# --------------------------------------------------------------------------------------------


class Steps:
    def __init__(self) -> None:
        self.active: dict[str, float] | None = None

    @contextlib.contextmanager
    def recording(self) -> Iterator[dict[str, float]]:
        self.active = defaultdict(float)
        try:
            yield self.active
        finally:
            self.active = None

    def add(self, label: str, seconds: float) -> None:
        if self.active is not None:
            self.active[label] += seconds

    def wrap(self, owner: Any, attr: str, label: Callable[..., str] | str) -> None:
        original = getattr(owner, attr)

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                name = label if isinstance(label, str) else label(*args, **kwargs)
                self.add(name, time.perf_counter() - started)

        setattr(owner, attr, timed)


STEPS = Steps()


def instrument(spark: Any) -> None:
    """Time the pieces run_batch and the variants call (module attributes looked up at call time)."""
    from pyspark.sql.readwriter import DataFrameWriter

    from batch_layer.master.dataset import MasterDataset
    from batch_layer.master.delta_rs import DeltaRsEngine
    from batch_layer.recompute import job as recompute
    from batch_layer.recompute import publish

    STEPS.wrap(MasterDataset, "append_barrier", "1 barrier append (delta-rs commit)")
    STEPS.wrap(MasterDataset, "snapshot", "2 snapshot (delta log, file list, Spark plan)")
    STEPS.wrap(recompute, "write_generation", lambda rows, table, *a, **k: f"3 gold {table.name}: write_generation")
    STEPS.wrap(DataFrameWriter, "parquet", "3.1  of which Spark job: scan+aggregate+write parquet")
    STEPS.wrap(DeltaRsEngine, "commit_files", "3.2  of which delta-rs commit_files (gold Delta commit)")
    STEPS.wrap(recompute, "redis_client", "4 redis: client + begin + flip")
    STEPS.wrap(publish, "begin", "4 redis: client + begin + flip")
    STEPS.wrap(publish, "load_view", lambda rows, view, **k: f"5 redis load {view.name} (load_view)")
    STEPS.wrap(publish, "flip", "4 redis: client + begin + flip")
    STEPS.wrap(publish, "drop_stale", "7 redis drop_stale (SCAN + UNLINK of the previous generation)")
    STEPS.wrap(type(spark.range(1)), "count", "6 events.count() (another scan of the snapshot)")


# --------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------


def event_chunks(schema: pa.Schema, events: int, *, users: int, merchants: int, chunk_rows: int,
                 seed: int) -> Iterator[pa.Table]:
    """Payments in master layout: uniform users and merchants, amounts with 2 decimals in [0.50, 500),
    event times uniform over 24 hours UTC from 2026-01-01, ``_kind`` = 'event'."""
    rng = np.random.default_rng(seed)
    user_names = pa.array([f"user-{i:06d}" for i in range(users)], pa.string())
    merchant_names = pa.array([f"merchant-{i:04d}" for i in range(merchants)], pa.string())
    start_us = int(START.timestamp()) * 1_000_000
    for offset in range(0, events, chunk_rows):
        n = min(chunk_rows, events - offset)
        columns = {
            "user_id": user_names.take(pa.array(rng.integers(0, users, n, dtype=np.int32))),
            "merchant": merchant_names.take(pa.array(rng.integers(0, merchants, n, dtype=np.int32))),
            "amount": pa.array(np.round(rng.uniform(0.5, 500.0, n), 2), pa.float64()),
            "event_time": pa.array(start_us + rng.integers(0, DAY_US, n, dtype=np.int64), pa.timestamp("us", tz="UTC")),
            "_kind": pa.repeat("event", n).cast(pa.string()),
        }
        yield pa.Table.from_arrays([columns[f.name] for f in schema], schema=schema)


def chunk_rows(args: argparse.Namespace, events: int) -> int:
    """Rows per append: --chunk-rows, but at least --min-files appends (delta-rs writes one row group per
    file at these sizes, and Spark cannot split a row group: one file would leave one core idle)."""
    return max(1, min(args.chunk_rows, -(-events // args.min_files)))


def build_master(settings: Any, pipeline: Any, args: argparse.Namespace, events: int) -> tuple[int, float]:
    """Append the synthetic dataset; returns (master files, seconds)."""
    from deltalake import DeltaTable

    from batch_layer.master.dataset import MasterDataset

    master = MasterDataset.open(settings, pipeline)
    started = time.perf_counter()
    for chunk in event_chunks(master.schema, events, users=args.users, merchants=args.merchants,
                              chunk_rows=chunk_rows(args, events), seed=args.seed):
        master.append(chunk, metadata={"lambda.source": "benchmark"})
    return len(DeltaTable(str(settings.master_path)).file_uris()), time.perf_counter() - started


# --------------------------------------------------------------------------------------------
# The variants
# --------------------------------------------------------------------------------------------

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
    """run_batch minus Redis: barrier, snapshot, transform, aggregate + gold per view, event count."""
    from batch_layer.master.dataset import MasterDataset
    from batch_layer.master.engines import get_engine
    from batch_layer.recompute import job as recompute

    engine = get_engine(settings.storage_engine)
    master = MasterDataset(settings.master_path, pipeline, engine)
    generation = master.append_barrier(f"bench-{uuid.uuid4().hex[:8]}")
    events = master.snapshot(spark, generation)
    rows = pipeline.transform(events)
    written = {}
    for view in pipeline.views:
        gold = recompute.write_generation(view.aggregate(rows), settings.gold_path / view.name, engine,
                                          generation=generation)
        written[view.name] = gold.rows
    return {"generation": generation, "events": events.count(), "rows": written}


# --------------------------------------------------------------------------------------------
# Checks (untimed, after the warm-up)
# --------------------------------------------------------------------------------------------


def verify(spark: Any, settings: Any, pipeline: Any, b_out: Path, a_result: dict[str, Any], redis_url: str,
           events: int) -> list[str]:
    """Gold (current content) == B's output row by row; Redis hashes hold as many fields as gold rows."""
    import redis
    from deltalake import DeltaTable
    from pyspark.sql import functions as F

    from serving.store.keys import Keys, row_parts

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
    from serving.store.generations import served_generation

    client = redis.Redis.from_url(redis_url)
    keys = Keys(pipeline.name)
    generation = a_result["generation"]
    served = served_generation(client, keys)
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


# --------------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------------


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def machine_busy_seconds() -> float:
    """CPU seconds all processes of the machine have been busy (Linux /proc/stat; 0 elsewhere)."""
    try:
        ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    except (OSError, ValueError):
        return 0.0
    return (sum(ticks) - ticks[3] - ticks[4]) / _CLOCK_TICKS


def own_cpu_seconds(extra_pids: tuple[int, ...] = ()) -> float:
    """CPU seconds of this process and its descendants (JVM, Python workers), plus ``extra_pids`` (Redis)."""
    children: dict[int, list[int]] = defaultdict(list)
    cpu: dict[int, float] = {}
    for entry in Path("/proc").iterdir() if Path("/proc/stat").exists() else ():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:
            continue
        rest = text[text.rindex(")") + 2:].split()
        pid = int(entry.name)
        children[int(rest[1])].append(pid)
        cpu[pid] = sum(int(x) for x in rest[11:15]) / _CLOCK_TICKS  # utime stime cutime cstime
    total, todo = 0.0, [os.getpid(), *extra_pids]
    while todo:
        pid = todo.pop()
        total += cpu.get(pid, 0.0)
        todo.extend(children.get(pid, ()))
    return total


def others_cpu(seconds: float, extra_pids: tuple[int, ...]) -> float:
    """Cores used by processes other than ours (other jobs on a shared machine), sampled over ``seconds``."""
    machine, own = machine_busy_seconds(), own_cpu_seconds(extra_pids)
    time.sleep(seconds)
    return max(0.0, (machine_busy_seconds() - machine) - (own_cpu_seconds(extra_pids) - own)) / seconds


def wait_until_quiet(args: argparse.Namespace, extra_pids: tuple[int, ...]) -> tuple[float, float]:
    """Before a timed run, wait (up to --quiet-timeout) until other processes use < --quiet-cores cores.
    Returns (seconds waited, cores the others used in the last sample)."""
    started = time.perf_counter()
    load = others_cpu(1.0, extra_pids)
    while load > args.quiet_cores and time.perf_counter() - started < args.quiet_timeout:
        load = others_cpu(2.0, extra_pids)
    return time.perf_counter() - started, load


def redis_info(url: str) -> dict[str, Any]:
    import redis

    client = redis.Redis.from_url(url)
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


def run_size(spark: Any, args: argparse.Namespace, root: Path, events: int) -> None:
    from deploy.redis_server import ensure_embedded_redis, stop_embedded_redis
    from deploy.settings import load_settings
    from shared_logic.registry import load_pipeline

    size_dir = root / f"events-{events}"
    settings = load_settings(**settings_overrides(args, size_dir))
    pipeline = load_pipeline("payments")
    print(f"\n## {events:,} events: generating the master dataset in {size_dir} ...", flush=True)
    files, gen_seconds = build_master(settings, pipeline, args, events)
    print(f"   {files} parquet files appended in {gen_seconds:.1f}s "
          f"({args.users:,} users, {args.merchants:,} merchants, chunks of {chunk_rows(args, events):,} rows)", flush=True)
    redis_url = ensure_embedded_redis(size_dir / "redis")
    b_root = Path(tempfile.mkdtemp(prefix="hand-", dir=size_dir))

    variants = {
        "A": Variant("A", "A  run_batch: full recompute incl. Redis load + flip"),
        "B": Variant("B", "B  hand-written Spark SQL, same files -> parquet"),
        "C": Variant("C", "C  recompute without Redis (barrier..gold commit, count)"),
    }
    results: dict[str, dict[str, Any]] = {}

    def run(key: str, iteration: int) -> float:
        out = b_root / f"run-{iteration}"
        settle(spark, redis_url)
        before = redis_info(redis_url)
        pids = (int(before["process_id"]),)
        waited, load_before = wait_until_quiet(args, pids)
        machine, own = machine_busy_seconds(), own_cpu_seconds(pids)
        with STEPS.recording() as steps:
            started = time.perf_counter()
            if key == "A":
                results[key] = variant_a(spark, settings, pipeline, redis_url)
            elif key == "B":
                results[key] = variant_b(spark, settings, out)
            else:
                results[key] = variant_c(spark, settings, pipeline)
            seconds = time.perf_counter() - started
        machine, own = machine_busy_seconds() - machine, own_cpu_seconds(pids) - own
        after = redis_info(redis_url)
        steps["9.05 (CPU seconds used by this benchmark: driver, JVM, Python workers, Redis)"] = own
        steps["9.06 (CPU seconds used by OTHER processes on the machine during the run)"] = max(0.0, machine - own)
        steps["9.07 (waited for other processes to quiet down before the run, s)"] = waited
        steps["9.08 (cores used by other processes just before the run)"] = load_before
        steps["9.1 (Redis server CPU seconds during the run)"] = redis_cpu(after) - redis_cpu(before)
        steps["9.2 (Redis forks during the run: AOF rewrites)"] = float(after["total_forks"] - before["total_forks"])
        steps["9.25 (Redis AOF growth during the run, MB)"] = (after["aof_current_size"] - before["aof_current_size"]) / 1e6
        steps["9.3 (wait for Redis to go idle after the run: AOF rewrite, lazy free)"] = settle(spark, redis_url)
        log.info("%s run %d: %.2fs %s", key, iteration, seconds, {k: round(v, 2) for k, v in steps.items()})
        if iteration > 0:
            variants[key].seconds.append(seconds)
            variants[key].steps.append(dict(steps))
        return seconds

    try:
        print("   warm-up (untimed): A B C", flush=True)
        for key in "ABC":
            seconds = run(key, 0)
            print(f"     {key}: {seconds:.2f}s", flush=True)
        if not args.no_verify:
            problems = verify(spark, settings, pipeline, b_root / "run-0", results["A"], redis_url, events)
            print("   check: gold == hand-written output row by row; Redis serves A's generation, every row's distinct values: "
                  + ("OK" if not problems else "MISMATCH: " + "; ".join(problems)), flush=True)
        shutil.rmtree(b_root / "run-0", ignore_errors=True)
        for i in range(1, args.repeat + 1):
            line = []
            for key in "ABC":
                line.append(f"{key} {run(key, i):.2f}s")
                shutil.rmtree(b_root / f"run-{i}", ignore_errors=True)
            print(f"   repeat {i}/{args.repeat}: " + "  ".join(line), flush=True)
    finally:
        stop_embedded_redis(size_dir / "redis")
        shutil.rmtree(b_root, ignore_errors=True)

    report(args, spark, settings, events, files, variants, results)


def report(args: argparse.Namespace, spark: Any, settings: Any, events: int, files: int,
           variants: dict[str, Variant], results: dict[str, dict[str, Any]]) -> None:
    med = {k: statistics.median(v.seconds) for k, v in variants.items()}
    a_b, c_b = med["A"] / med["B"], med["C"] / med["B"]
    rows = ", ".join(f"{name} {n:,}" for name, n in results["A"]["rows"].items())
    print()
    print(f"=== batch recompute, {events:,} events ({files} master files; gold rows: {rows}) ===")
    print(f"Spark {spark.version}, master {settings.spark_master} (defaultParallelism "
          f"{spark.sparkContext.defaultParallelism}, {os.cpu_count()} CPUs), "
          f"spark.sql.shuffle.partitions={spark.conf.get('spark.sql.shuffle.partitions')}, "
          f"AQE={spark.conf.get('spark.sql.adaptive.enabled')}, driver memory {settings.spark_driver_memory}; "
          f"median of {args.repeat} timed runs after 1 warm-up, order A B C repeated")
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


def code_version() -> str:
    """The commit benchmarked, and which tracked product files differ from it (the working tree is what runs)."""
    import subprocess

    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        changed = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", "batch_layer", "shared_logic",
                                  "serving", "deploy", "speed_layer"], capture_output=True, text=True,
                                 check=True).stdout.split("\n")
    except (OSError, subprocess.SubprocessError):
        return "unknown (not a git checkout)"
    changed = [line[3:] for line in changed if line.strip()]
    return f"commit {head}" + (f" + uncommitted changes in {', '.join(changed)}" if changed else "")


def settings_overrides(args: argparse.Namespace, data_dir: Path) -> dict[str, Any]:
    overrides: dict[str, Any] = {"data_dir": data_dir, "pipeline": "payments",
                                 "spark_driver_memory": args.driver_memory}
    if args.shuffle_partitions is not None:
        overrides["spark_shuffle_partitions"] = args.shuffle_partitions
    if args.spark_master is not None:
        overrides["spark_master"] = args.spark_master
    return overrides


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] + " Times (A) run_batch, (B) a hand-written Spark SQL job over the "
        "same snapshot files writing parquet, and (C) run_batch's compute + gold part without Redis; prints "
        f"medians, A/B and C/B (target A/B <= {TARGET_A_OVER_B}), events/s and a per-step breakdown.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--events", type=int, nargs="+", default=[1_000_000, 10_000_000], metavar="N",
                        help="event counts to benchmark, one fresh master dataset each")
    parser.add_argument("--repeat", type=int, default=2, help="timed runs per variant (after one warm-up)")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="where to put master/gold tables, Spark temp and the embedded Redis "
                             "(default: a temporary dir, deleted at the end; a given dir is kept)")
    parser.add_argument("--users", type=int, default=50_000, help="distinct user_id values")
    parser.add_argument("--merchants", type=int, default=200, help="distinct merchant values")
    parser.add_argument("--chunk-rows", type=int, default=1_000_000,
                        help="rows per MasterDataset.append (one commit / file each)")
    parser.add_argument("--min-files", type=int, default=4,
                        help="at least this many appends (files), even if chunks get smaller than --chunk-rows")
    parser.add_argument("--seed", type=int, default=42, help="random seed of the generated events")
    parser.add_argument("--driver-memory", default="8g", help="spark_driver_memory setting")
    parser.add_argument("--shuffle-partitions", type=int, default=None,
                        help="spark_shuffle_partitions setting (default: the Settings default / LAMBDA_ env)")
    parser.add_argument("--spark-master", default=None, help="spark_master setting (default: Settings default)")
    parser.add_argument("--quiet-cores", type=float, default=0.25,
                        help="before each run, wait until other processes on the machine use fewer cores than this")
    parser.add_argument("--quiet-timeout", type=float, default=120.0,
                        help="longest wait (s) for the machine to quiet down before a run; then run anyway")
    parser.add_argument("--no-verify", action="store_true", help="skip the untimed correctness check after warm-up")
    parser.add_argument("--verbose", action="store_true", help="log the platform's INFO messages")
    args = parser.parse_args(argv)
    if args.repeat < 1 or min(args.events) < 1 or args.chunk_rows < 1 or args.min_files < 1 or args.users < 1 or args.merchants < 1:
        parser.error("--repeat, --events, --chunk-rows, --users and --merchants must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from deploy.settings import load_settings
    from deploy.spark import build_spark

    made_root = args.data_dir is None
    root = Path(tempfile.mkdtemp(prefix="lp-bench-")) if made_root else args.data_dir.resolve()
    run_root = root / f"batch-recompute-{time.strftime('%Y%m%d-%H%M%S')}"
    run_root.mkdir(parents=True, exist_ok=False)
    try:
        settings = load_settings(**settings_overrides(args, run_root))
        started = time.perf_counter()
        spark = build_spark(settings, app_name="bench-batch-recompute")
        print(f"code: {code_version()}", flush=True)
        print(f"SparkSession up in {time.perf_counter() - started:.1f}s: master {settings.spark_master}, "
              f"shuffle partitions {settings.spark_shuffle_partitions}, driver memory {settings.spark_driver_memory}; "
              f"data in {run_root}", flush=True)
        instrument(spark)
        for events in args.events:
            run_size(spark, args, run_root, events)
        spark.stop()
    finally:
        if made_root:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
