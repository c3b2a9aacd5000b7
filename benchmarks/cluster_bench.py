#!/usr/bin/env python
"""Benchmark: the batch recompute on a two-worker standalone Spark cluster against ``local[2]``.

    .venv/bin/python benchmarks/cluster_bench.py --events 1000000 --repeat 2
    .venv/bin/python benchmarks/cluster_bench.py --events 100000 --repeat 2      # quick

One synthetic payments master dataset (as ``batch_recompute.py`` builds it) is copied so each
variant has its own identical master, gold tables and embedded Redis. A standalone cluster is
started on 127.0.0.1 from the pyspark wheel's own ``bin/spark-class`` (a master and two workers of
1 core each, as ``tests/support/clusters.py`` starts it for the cluster test). Then two long-lived
child processes (this file with ``--child``) each hold one SparkSession:

  local[2]   ``LAMBDA_SPARK_MASTER=local[2]``: driver and 2 task threads in one JVM;
  cluster    ``LAMBDA_SPARK_MASTER=spark://127.0.0.1:PORT``: the driver here, one executor JVM per
             worker (1 core each, spark.executor.memory at Spark's default), the project's code
             shipped to them with the job (``deploy.runtime.shipping``), shuffles over loopback.

Same machine, same cores (2 task slots each), same data: the ratio cluster / local[2] is the
overhead of running distributed (executor JVMs, task serialisation, shuffle over the network
stack, code shipping), not a speed-up. Each child runs ``run_batch`` once untimed (warm-up), then
the two take turns (local cluster local cluster ...) for ``--repeat`` rounds; the idle one holds
its session but does no work. Printed: the median seconds of each, events/s, the CPU seconds of
everything this benchmark started (both children, the cluster's daemons and executors; not the
daemonized Redis servers)
during each run, and cluster / local[2]. Before each run it waits (bounded) for the machine to
quiet down. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _batch_data import event_chunks
from _harness import ROOT, print_medians, stop, tree_cpu_seconds, wait_quiet

VARIANTS = ("local[2]", "cluster")
_MARK = "cluster-bench: "  # a child's answers on stdout start with this


def _child(data_dir: Path, spark_master: str, storage_engine: str, driver_memory: str, partitions: int) -> None:
    """One SparkSession on ``spark_master``; runs ``run_batch`` for each "run" line on stdin."""
    from batch_layer.recompute.job import run_batch
    from deploy.runtime.redis_server import ensure_embedded_redis, stop_embedded_redis
    from deploy.runtime.spark import build_spark
    from deploy.settings import load_settings
    from shared_logic import load_pipeline

    settings = load_settings(data_dir=data_dir, pipeline="payments", spark_master=spark_master,
                             storage_engine=storage_engine, spark_driver_memory=driver_memory,
                             spark_shuffle_partitions=partitions)
    pipeline = load_pipeline("payments")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: the finally below stops Spark and Redis
    redis_url = ensure_embedded_redis(settings.redis_dir)
    spark = build_spark(settings, f"bench-cluster-{'local' if spark_master.startswith('local') else 'cluster'}")
    print(_MARK + json.dumps({"ready": True, "parallelism": spark.sparkContext.defaultParallelism}), flush=True)
    try:
        for line in sys.stdin:
            if line.strip() != "run":
                break
            started = time.perf_counter()
            result = run_batch(spark, settings, pipeline, redis_url=redis_url)
            print(_MARK + json.dumps({"seconds": time.perf_counter() - started, "events": result.events,
                              "generation": result.generation}), flush=True)
    finally:
        stop_embedded_redis(settings.redis_dir)  # first: quick, and a slow spark.stop() may be cut short
        spark.stop()
    sys.stdout.flush()
    os._exit(0)  # pyarrow/delta-rs may abort at interpreter shutdown (see deploy.cli.main)


class _Session:
    """A ``--child`` process: its SparkSession is up once the constructor returns."""

    def __init__(self, name: str, data_dir: Path, master: str, args: argparse.Namespace) -> None:
        self.name, self.log = name, (data_dir.parent / f"{data_dir.name}.log").open("w")
        env = {k: v for k, v in os.environ.items() if not k.startswith("LAMBDA_")}
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--child", str(data_dir), master, "--storage-engine", args.storage_engine,
             "--driver-memory", args.driver_memory, "--shuffle-partitions", str(args.shuffle_partitions)],
            cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True)
        try:
            self.parallelism = self._answer()["parallelism"]
        except BaseException:
            stop(self.proc)  # its SparkSession and Redis go with it (the child's finally)
            self.log.close()
            raise

    def _answer(self) -> dict[str, Any]:
        """The child's next answer; other lines on its stdout (Spark's, Ivy's) go to its log."""
        for line in self.proc.stdout:  # type: ignore[union-attr]
            if line.startswith(_MARK):
                return json.loads(line[len(_MARK):])
            self.log.write(line)
        raise SystemExit(f"the {self.name} session exited ({self.proc.wait()}); see {self.log.name}")

    def run(self) -> dict[str, Any]:
        self.proc.stdin.write("run\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]
        return self._answer()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.write("quit\n")  # type: ignore[union-attr]
            self.proc.stdin.flush()  # type: ignore[union-attr]
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                stop(self.proc)
        self.log.close()


def _build_master(data_dir: Path, args: argparse.Namespace) -> int:
    from deltalake import DeltaTable

    from batch_layer.master.dataset import MasterDataset
    from deploy.settings import load_settings
    from shared_logic import load_pipeline

    settings = load_settings(data_dir=data_dir, pipeline="payments", storage_engine="delta-rs")
    master = MasterDataset.open(settings, load_pipeline("payments"))
    chunk = max(1, min(args.chunk_rows, -(-args.events // args.min_files)))
    for rows in event_chunks(master.schema, args.events, users=args.users, merchants=args.merchants,
                             chunk_rows=chunk, seed=7):
        master.append(rows, metadata={"lambda.source": "benchmark"})
    return len(DeltaTable(str(settings.master_path)).file_uris())


def bench(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(ROOT))
    from tests.support.clusters import StandaloneCluster

    root = Path(tempfile.mkdtemp(prefix="lp-cluster-bench-")) if args.data_dir is None else args.data_dir.resolve()
    dirs = {v: root / v.replace("[", "-").replace("]", "") for v in VARIANTS}
    sessions: dict[str, _Session] = {}
    cluster = StandaloneCluster(root / "daemons", workers=2, memory=args.worker_memory)
    try:
        started = time.perf_counter()
        files = _build_master(dirs["local[2]"], args)
        shutil.copytree(dirs["local[2]"] / "master", dirs["cluster"] / "master")
        print(f"master: {args.events:,} payments events in {files} files, {args.users:,} users "
              f"({time.perf_counter() - started:.1f}s); copied for the second variant", flush=True)
        cluster.start()
        print(f"cluster: {cluster.url}, {len(cluster.alive_workers())} workers of 1 core, {args.worker_memory} each",
              flush=True)
        for name, master in (("local[2]", "local[2]"), ("cluster", cluster.url)):
            began = time.perf_counter()
            sessions[name] = _Session(name, dirs[name], master, args)
            print(f"  {name} session up in {time.perf_counter() - began:.1f}s "
                  f"(defaultParallelism {sessions[name].parallelism})", flush=True)
        _rotation(sessions, args)
        apps = cluster.master_json().get("activeapps", [])
        print(f"cluster master: {len(apps)} running app(s), cores granted {[a.get('cores') for a in apps]}; "
              f"workers: {[w.get('coresused') for w in cluster.master_json().get('workers', [])]} cores used", flush=True)
    finally:
        for session in sessions.values():
            session.close()
        cluster.stop()
        if args.data_dir is None:
            shutil.rmtree(root, ignore_errors=True)


def _rotation(sessions: dict[str, _Session], args: argparse.Namespace) -> None:
    seconds: dict[str, list[float]] = {v: [] for v in VARIANTS}
    cpu: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for round_ in range(args.repeat + 1):
        for name in VARIANTS:
            if round_:
                wait_quiet(tree_cpu_seconds, args.quiet_cores, args.quiet_timeout)
            cpu0 = tree_cpu_seconds()
            result = sessions[name].run()
            used = tree_cpu_seconds() - cpu0
            if result["events"] != args.events:
                raise SystemExit(f"{name}: run_batch counted {result['events']} events, expected {args.events}")
            label = "warm-up" if round_ == 0 else f"round {round_}"
            print(f"  {label:8} {name:9} {result['seconds']:7.2f}s  CPU {used:6.1f}s  generation {result['generation']}",
                  flush=True)
            if round_:
                seconds[name].append(result["seconds"])
                cpu[name].append(used)
    med = print_medians(f"batch recompute of {args.events:,} payments events (run_batch incl. Redis), "
                        f"{args.storage_engine} engine", seconds, baseline="local[2]", per_second=args.events)
    cpu_med = {v: statistics.median(c) for v, c in cpu.items()}
    print(f"  cluster / local[2] = {med['cluster'] / med['local[2]']:.2f} by wall seconds, "
          f"{cpu_med['cluster'] / cpu_med['local[2]']:.2f} by CPU seconds of everything the benchmark started "
          f"(median CPU s: local[2] {cpu_med['local[2]']:.1f}, cluster {cpu_med['cluster']:.1f})", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=2, help="timed runs of each variant (after one warm-up)")
    parser.add_argument("--users", type=int, default=50_000)
    parser.add_argument("--merchants", type=int, default=200)
    parser.add_argument("--chunk-rows", type=int, default=1_000_000)
    parser.add_argument("--min-files", type=int, default=4)
    parser.add_argument("--storage-engine", choices=("delta-rs", "delta-spark"), default="delta-rs")
    parser.add_argument("--shuffle-partitions", type=int, default=8)
    parser.add_argument("--driver-memory", default="2g")
    parser.add_argument("--worker-memory", default="2g", help="memory each worker offers its executor")
    parser.add_argument("--quiet-cores", type=float, default=0.3)
    parser.add_argument("--quiet-timeout", type=float, default=30.0)
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--child", nargs=2, metavar=("DATA_DIR", "SPARK_MASTER"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(Path(args.child[0]), args.child[1], args.storage_engine, args.driver_memory, args.shuffle_partitions)
    bench(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
