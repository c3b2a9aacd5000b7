"""The view store on a 3-master Redis Cluster against one Redis: speed-layer and key-read throughput.

    python benchmarks/cluster_store_bench.py                       # defaults below (a few minutes)
    python benchmarks/cluster_store_bench.py --events 100000 --versions 10 --repeat 1 --read-seconds 3

Each round, for each store in turn (one embedded Redis; a local cluster of 3 masters from the same
binary, 16 slot buckets, no replicas), in this one process and SparkSession: a fresh payments master
dataset of ``--events`` events over ``--users`` users in ``--versions`` commits, a batch run, then
(1) the speed layer streams it from scratch: events/s = events / time to catch up; a second batch
run then folds the streamed rows into a generation (a top-N reads every realtime row of its
segment, so it is measured with the segment empty, as after each batch run); (2) key reads:
``--concurrency`` tasks call ``ServingStore.read`` (the API's atomic Lua read, without HTTP: the
API process is the same on both stores) on random users for ``--read-seconds`` s: reads/s; and the
same for top-10 (one Lua call per bucket on the cluster, merged). Medians and ratios cluster / one.

On this 2-core machine the three masters share the cores with Spark, so the cluster cannot show
more throughput than one Redis here; what the figures show is what bucketing costs (per-bucket
calls, the client's routing). Nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _harness import medians, print_medians, write_figures
from speed_layer_bench import catch_up, payments_table

from batch_layer.master.dataset import MasterDataset
from batch_layer.master.engines import get_engine
from batch_layer.recompute.job import run_batch
from deploy.runtime.redis_cluster import LocalRedisCluster
from deploy.runtime.redis_server import ensure_embedded_redis, stop_embedded_redis
from deploy.settings import load_settings
from serving.store.reader import ServingStore
from shared_logic import load_pipeline

STORES = ("one Redis", "3-master cluster")


async def _reads(url: str, users: int, seconds: float, concurrency: int, top: bool) -> float:
    store = ServingStore(url, "payments")
    done, deadline = 0, 0.0

    async def worker(seed: int) -> None:
        nonlocal done
        rng = random.Random(seed)
        while time.perf_counter() < deadline:
            if top:
                await store.top("spend_by_user", "sum_amount", None, 10)
            else:
                await store.read("spend_by_user", [(f"user-{rng.randrange(users)}", None)], ["count", "sum_amount"], [])
            done += 1

    if top:  # the first top-N builds the batch rankings (once per generation): not what is measured
        await store.top("spend_by_user", "sum_amount", None, 10)
    started = time.perf_counter()
    deadline = started + seconds
    await asyncio.gather(*(worker(i) for i in range(concurrency)))
    rate = done / (time.perf_counter() - started)
    await store.close()
    return rate


def _one(spark, store: str, args: argparse.Namespace, root: Path) -> dict[str, float]:
    data = root / store.replace(" ", "-")
    shutil.rmtree(data, ignore_errors=True)
    cluster = None
    if store == STORES[0]:
        url = ensure_embedded_redis(data / "redis")
    else:
        cluster = LocalRedisCluster(data / "cluster").start()
        url = cluster.url
    try:
        settings = load_settings(data_dir=data, pipeline="payments", redis_url=url, speed_trigger_seconds=0.0,
                                 speed_max_rows_per_trigger=500_000, speed_write_partitions=2)
        pipeline = load_pipeline("payments")
        master = MasterDataset(settings.master_path, pipeline, get_engine("delta-rs"))
        rng = np.random.default_rng(3)
        master.append(payments_table(pipeline, 1000, rng, args.users))
        run_batch(spark, settings, pipeline, redis_url=url)
        per = args.events // args.versions
        for _ in range(args.versions):
            master.append(payments_table(pipeline, per, rng, args.users))
        latest = master.latest_version()
        streamed = catch_up(spark, settings, pipeline, url, latest).seconds
        # Reads after a batch run folded the streamed rows into a generation: a top-N's cost grows with
        # the realtime segment's rows (every one is a candidate), which a batch run empties.
        run_batch(spark, settings, pipeline, redis_url=url)
        reads = asyncio.run(_reads(url, args.users, args.read_seconds, args.concurrency, top=False))
        tops = asyncio.run(_reads(url, args.users, args.read_seconds, args.concurrency, top=True))
        print(f"  {store:<18} speed layer {per * args.versions / streamed:>10,.0f} events/s   key reads "
              f"{reads:>8,.0f} /s   top-10 {tops:>7,.0f} /s", flush=True)
        return {"events/s": per * args.versions / streamed, "reads/s": reads, "top/s": tops}
    finally:
        if cluster is not None:
            cluster.stop()
        else:
            stop_embedded_redis(data / "redis")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--versions", type=int, default=20)
    parser.add_argument("--users", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=2, help="rounds (each store once per round, alternating)")
    parser.add_argument("--read-seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures as JSON here (make bench)")
    args = parser.parse_args()

    from deploy.runtime.spark import build_spark

    root = Path(tempfile.mkdtemp(prefix="cluster-bench-"))
    spark = build_spark(load_settings(data_dir=root / "spark", spark_driver_memory="4g"), "bench-cluster-store")
    runs: dict[str, dict[str, list[float]]] = {s: {"events/s": [], "reads/s": [], "top/s": []} for s in STORES}
    try:
        for round_ in range(1, args.repeat + 1):
            print(f"round {round_}", flush=True)
            for store in STORES:
                for name, value in _one(spark, store, args, root).items():
                    runs[store][name].append(value)
    finally:
        spark.stop()
        shutil.rmtree(root, ignore_errors=True)
    ratios = {}
    for figure in ("events/s", "reads/s", "top/s"):
        med = print_medians(f"{figure} (cluster / one Redis)", {s: runs[s][figure] for s in STORES},
                            baseline=STORES[0], unit=figure, higher_is_better=True)
        ratios[figure] = {"one": med[STORES[0]], "cluster": med[STORES[1]], "ratio": med[STORES[1]] / med[STORES[0]]}
    if args.json:
        write_figures(args.json, "cluster_store", {"events": args.events, "users": args.users, **ratios,
                                                    "runs": {s: {f: medians({f: v})[f] for f, v in runs[s].items()}
                                                             for s in STORES}})


if __name__ == "__main__":
    main()
