"""Top-N as the realtime segment grows: the threshold merge against reading every realtime row.

No Spark. Into the platform's embedded Redis (and, with ``--cluster``, a local 3-master cluster)
goes one generation of ``--batch`` rows of a sum measure (as the batch publish lays it out, one
hash field per row) and a realtime segment of R rows (as the speed layer lays it out, one sorted
set per measure; half of them keys the batch has, half new), for each R of ``--realtime``. Then
``ServingStore.top`` (the API's atomic read, in process, no HTTP) of the top ``-n`` keys, with
the measure's shape known (``combines='sum'``: the threshold merge, about n keys read) and unknown
(``''``: every realtime row is a candidate), alternating in rounds, ``--concurrency`` in flight.
Every answer is checked against a plain-Python merge of the same parts. Prints top-N/s per R,
and the ratio threshold / every-row; the threshold's figure should stay flat as R grows.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _harness import print_medians, write_figures

from deploy.runtime.redis_cluster import LocalRedisCluster
from deploy.runtime.redis_server import ensure_embedded_redis, stop_embedded_redis
from serving.store.connection import redis_client, store_keys
from serving.store.generation_meta import GenerationMeta
from serving.store.reader import ServingStore
from serving.store.session import PipelineStore

PIPELINE, VIEW, MEASURE, GENERATION = "bench", "spend", "sum_amount", 7
MERGES = {"threshold (combines='sum')": "sum", "every realtime row (combines='')": ""}


def _load(url: str, batch: int, realtime: int, seed: int) -> dict[str, float]:
    """Publish the generation and its segment; the merged value of every key (the oracle)."""
    rng = random.Random(seed)
    client, keys = redis_client(url), store_keys(PIPELINE, url)
    store = PipelineStore(client, keys)
    epoch = store.ensure_epoch()
    parts_b = {f"user-{i}": round(rng.uniform(0, 1000), 2) for i in range(batch)}
    users = sorted(parts_b)
    parts_r = {(rng.choice(users) if i % 2 else f"new-{i}"): round(rng.uniform(0, 300), 2) for i in range(realtime)}
    gen = GENERATION + realtime  # one generation per size, each newer than the last (sizes ascending)
    store.generations.begin(gen, epoch)
    pipe = client.pipeline(transaction=False)
    for i, (key, value) in enumerate(parts_b.items()):
        pipe.hset(keys.for_key(key).rows(gen, VIEW), key, json.dumps([value]))
        if i % 5000 == 4999:
            pipe.execute()
    pipe.execute()
    assert store.generations.flip(gen, epoch, GenerationMeta(measures={VIEW: [MEASURE]}))
    for bucket in keys.all_buckets():
        client.hset(bucket.segment_meta(gen), "processed", gen + 1)
    for i, (key, value) in enumerate(parts_r.items()):
        pipe.zadd(keys.for_key(key).segment_scores(gen, VIEW, MEASURE), {key: value})
        if i % 5000 == 4999:
            pipe.execute()
    pipe.execute()
    return {k: parts_b.get(k, 0.0) + parts_r.get(k, 0.0) for k in parts_b.keys() | parts_r.keys()}


async def _rate(url: str, combines: str, n: int, seconds: float, concurrency: int, want: list) -> float:
    store = ServingStore(url, PIPELINE)
    done, deadline = 0, 0.0

    async def check() -> None:
        read = await store.top(VIEW, MEASURE, None, n, combines)
        merged = {k: (read.batch.get(k) or 0.0) + (read.realtime.get(k) or 0.0)
                  for k in read.batch.keys() | read.realtime.keys()}
        got = sorted(merged.items(), key=lambda kv: (-kv[1], kv[0]))[:n]
        assert [k for k, _ in got] == [k for k, _ in want], "a top-N differs from the oracle"

    async def worker() -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            await store.top(VIEW, MEASURE, None, n, combines)
            done += 1

    await check()  # builds the batch ranking (once per generation): not what is measured
    started = time.perf_counter()
    deadline = started + seconds
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    rate = done / (time.perf_counter() - started)
    await check()
    await store.close()
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=100_000, help="rows in the served generation")
    parser.add_argument("--realtime", type=int, nargs="+", default=[1_000, 10_000, 50_000],
                        help="realtime segment sizes (rows)")
    parser.add_argument("-n", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3, help="rounds (each merge once per round, alternating)")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--cluster", action="store_true", help="also on a local 3-master Redis Cluster")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures as JSON here")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="top-merge-bench-"))
    stores = {"one Redis": ensure_embedded_redis(root / "redis")}
    cluster = None
    if args.cluster:
        cluster = LocalRedisCluster(root / "cluster").start()
        stores["3-master cluster"] = cluster.url
    figures: dict[str, dict[str, dict[str, float]]] = {}
    try:
        for store, url in stores.items():
            for size in args.realtime:
                merged = _load(url, args.batch, size, seed=size)
                want = sorted(merged.items(), key=lambda kv: (-kv[1], kv[0]))[:args.n]
                runs: dict[str, list[float]] = {name: [] for name in MERGES}
                for _ in range(args.repeat):
                    for name, combines in MERGES.items():
                        runs[name].append(asyncio.run(_rate(url, combines, args.n, args.seconds,
                                                            args.concurrency, want)))
                med = print_medians(f"{store}: top-{args.n}/s, {args.batch:,} batch rows, {size:,} realtime rows",
                                    runs, baseline=list(MERGES)[1], unit="top/s", higher_is_better=True)
                fast, slow = (med[name] for name in MERGES)
                figures.setdefault(store, {})[str(size)] = {"threshold": fast, "every_row": slow}
    finally:
        if cluster is not None:
            cluster.stop()
        stop_embedded_redis(root / "redis")
    if args.json:
        write_figures(args.json, "top_merge", figures)


if __name__ == "__main__":
    main()
