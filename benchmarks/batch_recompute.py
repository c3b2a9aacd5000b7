#!/usr/bin/env python
"""Benchmark: the platform's full batch recompute against a hand-written Spark SQL job.

For each event count it builds a payments master dataset (synthetic, generated as Arrow and
appended with ``MasterDataset.append`` in chunks, so the table has several files), then, in one
process and one SparkSession, times these variants in rotation, each timed round starting one
variant later (A B C D, B C D A, C D A B, ...), so that drift (JIT, page cache, GC, thermal) hits
every variant alike and each variant follows every other equally often (a job's time depends on
the one run before it in the same JVM: RESULTS.md, issue 30's batch figures). ``--repeat`` as a
multiple of the number of variants gives every position the same weight:

  A  ``run_batch``: the full recompute (barrier append, Spark snapshot read, shared transform,
     views aggregate, gold Delta write + commit, Redis load, flip, drop of the stale generation).
  B  a hand-written Spark SQL job over the SAME snapshot parquet files
     (``deltalake.DeltaTable(master).file_uris()``): the same aggregates per user and per user
     and 1-hour window (count, sum, min, max, collect_set(merchant)), written as parquet.
  C  the recompute's compute + gold part without Redis, as ``run_batch`` does it: barrier append,
     snapshot, the event count it keeps for its metadata, then per view
     ``write_generation(view.aggregate(rows))`` over the poison screen's checked rows. A - C is the
     Redis publishing cost; C / B is the framework's overhead on the Spark work.
  D  the peer a user would otherwise build (``_peers.batch_peer``, ``--no-peer`` leaves it out): B's
     SQL over the same files, each row written to Redis with one HSET from ``foreachPartition``
     (redis-py pipelines of 1,000 rows), no generations, no flip, rows overwritten in place. A / D
     is the price of the platform's publish (a new generation, the atomic flip, the old one dropped).

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
import logging
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from _batch_data import build_master, chunk_rows
from _batch_report import TARGET_A_OVER_B, Variant, redis_cpu, redis_info, report, settle
from _batch_steps import STEPS, instrument
from _batch_variants import variant_a, variant_b, variant_c, verify
from _harness import embedded_redis, git_commit, machine_busy_seconds, tree_cpu_seconds, wait_quiet, write_figures
from _peers import batch_peer, check_batch_peer

log = logging.getLogger("bench")


def wait_until_quiet(args: argparse.Namespace, extra_pids: tuple[int, ...]) -> tuple[float, float]:
    """Before a timed run, wait (up to --quiet-timeout) until other processes use < --quiet-cores cores.
    Returns (seconds waited, cores the others used in the last sample)."""
    return wait_quiet(lambda: tree_cpu_seconds(extra_pids), args.quiet_cores, args.quiet_timeout, say=False)


class _Rotation:
    """The variants of one event count, each run timed with the machine's and Redis's figures alongside."""

    def __init__(self, spark: Any, args: argparse.Namespace, settings: Any, pipeline: Any, redis_url: str,
                 b_root: Path) -> None:
        self.spark, self.args, self.settings, self.pipeline = spark, args, settings, pipeline
        self.redis_url, self.b_root = redis_url, b_root
        self.variants = {
            "A": Variant("A", "A  run_batch: full recompute incl. Redis load + flip"),
            "B": Variant("B", "B  hand-written Spark SQL, same files -> parquet"),
            "C": Variant("C", "C  recompute without Redis (barrier..gold commit, count)"),
        }
        if not args.no_peer:
            self.variants["D"] = Variant("D", "D  peer: hand-written Spark SQL -> Redis, HSET pipelines")
        self.keys = "".join(self.variants)
        self.results: dict[str, dict[str, Any]] = {}

    def _variant(self, key: str, iteration: int) -> dict[str, Any]:
        if key == "A":
            return variant_a(self.spark, self.settings, self.pipeline, self.redis_url)
        if key == "B":
            return variant_b(self.spark, self.settings, self.b_root / f"run-{iteration}")
        if key == "D":
            return batch_peer(self.spark, self.settings, self.redis_url, STEPS)
        return variant_c(self.spark, self.settings, self.pipeline)

    def run(self, key: str, iteration: int) -> float:
        spark, redis_url = self.spark, self.redis_url
        settle(spark, redis_url)
        before = redis_info(redis_url)
        pids = (int(before["process_id"]),)
        waited, load_before = wait_until_quiet(self.args, pids)
        machine, own = machine_busy_seconds(), tree_cpu_seconds(pids)
        with STEPS.recording() as steps:
            started = time.perf_counter()
            self.results[key] = self._variant(key, iteration)
            seconds = time.perf_counter() - started
        machine, own = machine_busy_seconds() - machine, tree_cpu_seconds(pids) - own
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
            self.variants[key].seconds.append(seconds)
            self.variants[key].steps.append(dict(steps))
        return seconds

    def all(self, events: int) -> None:
        """Warm-up A B C D (untimed), the check, then --repeat timed rounds, each rotated by one."""
        args, b_root = self.args, self.b_root
        print(f"   warm-up (untimed): {' '.join(self.keys)}", flush=True)
        for key in self.keys:
            seconds = self.run(key, 0)
            print(f"     {key}: {seconds:.2f}s", flush=True)
        if not args.no_verify:
            problems = verify(self.spark, self.settings, self.pipeline, b_root / "run-0", self.results["A"],
                              self.redis_url, events)
            if "D" in self.variants:
                problems += check_batch_peer(self.redis_url, self.results["A"]["rows"])
            print("   check: gold == hand-written output row by row; Redis serves A's generation, every row's distinct values"
                  + ("; D's hashes one per gold row" if "D" in self.variants else "") + ": "
                  + ("OK" if not problems else "MISMATCH: " + "; ".join(problems)), flush=True)
        shutil.rmtree(b_root / "run-0", ignore_errors=True)
        for i in range(1, args.repeat + 1):
            line = []
            shift = (i - 1) % len(self.keys)
            for key in self.keys[shift:] + self.keys[:shift]:
                line.append(f"{key} {self.run(key, i):.2f}s")
                shutil.rmtree(b_root / f"run-{i}", ignore_errors=True)
            print(f"   repeat {i}/{args.repeat}: " + "  ".join(line), flush=True)


def run_size(spark: Any, args: argparse.Namespace, root: Path, events: int) -> dict[str, float]:
    from deploy.settings import load_settings
    from shared_logic.registry import load_pipeline

    size_dir = root / f"events-{events}"
    settings = load_settings(**settings_overrides(args, size_dir))
    pipeline = load_pipeline("payments")
    print(f"\n## {events:,} events: generating the master dataset in {size_dir} ...", flush=True)
    files, gen_seconds = build_master(settings, pipeline, args, events)
    print(f"   {files} parquet files appended in {gen_seconds:.1f}s "
          f"({args.users:,} users, {args.merchants:,} merchants, chunks of {chunk_rows(args, events):,} rows)", flush=True)
    with embedded_redis(size_dir / "redis") as redis_url:
        b_root = Path(tempfile.mkdtemp(prefix="hand-", dir=size_dir))
        rotation = _Rotation(spark, args, settings, pipeline, redis_url, b_root)
        try:
            rotation.all(events)
        finally:
            shutil.rmtree(b_root, ignore_errors=True)
    return report(args, spark, settings, events, files, rotation.variants, rotation.results)


def code_version() -> str:
    """The commit benchmarked, and which tracked product files differ from it (the working tree is what runs)."""
    head, changed = git_commit("batch_layer", "shared_logic", "serving", "deploy", "speed_layer")
    if head == "unknown":
        return "unknown (not a git checkout)"
    return f"commit {head}" + (f" + uncommitted changes in {', '.join(changed)}" if changed else "")


def settings_overrides(args: argparse.Namespace, data_dir: Path) -> dict[str, Any]:
    # No class-data-sharing archive: only a command's own stop adopts one, so this driver would claim it on
    # every run and record its classes for a dump nobody maps (about 6% more CPU on every variant: RESULTS.md,
    # issue 30's batch figures), where a user's `batch run` maps the adopted archive.
    overrides: dict[str, Any] = {"data_dir": data_dir, "pipeline": "payments",
                                 "spark_driver_memory": args.driver_memory, "spark_class_archive_dir": ""}
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
    parser.add_argument("--repeat", type=int, default=2, help="timed runs per variant (after one warm-up); round i starts i-1 variants later")
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
    parser.add_argument("--no-peer", action="store_true",
                        help="leave out D, the peer a user would otherwise build (benchmarks/_peers.py)")
    parser.add_argument("--verbose", action="store_true", help="log the platform's INFO messages")
    parser.add_argument("--json", type=Path, default=None, help="write the figures to this JSON file (for suite.py)")
    args = parser.parse_args(argv)
    if args.repeat < 1 or min(args.events) < 1 or args.chunk_rows < 1 or args.min_files < 1 or args.users < 1 or args.merchants < 1:
        parser.error("--repeat, --events, --chunk-rows, --users and --merchants must be >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from deploy.runtime.spark import build_spark
    from deploy.settings import load_settings

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
        figures = [run_size(spark, args, run_root, events) for events in args.events]
        spark.stop()
        if args.json:
            write_figures(args.json, "batch_recompute", {"sizes": figures})
    finally:
        if made_root:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
