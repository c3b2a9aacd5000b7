#!/usr/bin/env python
"""Benchmark: the platform's tables on S3 (moto's S3 server on loopback) against a local folder.

Two costs, each measured on both stores side by side in one process, in rotation (local, s3,
local, s3, ...), so drift on the machine hits both alike:

  ingest  one event appended and committed, as HTTP ingest commits it (``MasterDataset.appender``:
          a kept delta-rs handle, one commit per call): the median of ``--appends`` commits.
  batch   a full ``run_batch`` (barrier, Spark snapshot read, shared transform, gold write and
          commit, Redis load, flip) over ``--events`` payments events, engine delta-rs, one
          SparkSession with Hadoop's S3A connector loaded: the median of ``--repeat`` runs.

Prints the medians and the ratio s3 / local. moto keeps objects in memory and serves them over
loopback HTTP, so the ratio shows the object-store protocol's cost (requests per commit, listing,
no rename), not a network's latency: against real S3 expect each request to cost more (10-50 ms).

Usage:
    .venv/bin/python benchmarks/object_store_bench.py                  # 20k events, 3 runs, 20 appends
    .venv/bin/python benchmarks/object_store_bench.py --events 100000 --repeat 2
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pyarrow as pa

KEY_ID, SECRET = "bench-key", "bench-secret"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(argv: list[str], probe: str) -> subprocess.Popen[bytes]:
    import httpx

    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while True:
        try:
            httpx.get(probe, timeout=1)
            return process
        except httpx.HTTPError:
            if time.monotonic() > deadline:
                process.kill()
                raise RuntimeError(f"{argv[0]} did not start") from None
            time.sleep(0.1)


def _events(n: int, schema: pa.Schema) -> pa.Table:
    base = 1_709_280_000_000_000  # 2024-03-01 in microseconds
    return pa.table({
        "user_id": [f"u{i % 997}" for i in range(n)], "merchant": [f"m{i % 13}" for i in range(n)],
        "amount": [float(i % 500) / 4 for i in range(n)],
        "event_time": pa.array([base + (i % 86_400) * 1_000_000 for i in range(n)], pa.timestamp("us", tz="UTC")),
        "_kind": ["event"] * n,
    }).select(schema.names).cast(schema)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=20_000, help="events in the master dataset for the batch runs")
    parser.add_argument("--repeat", type=int, default=3, help="timed batch runs per store")
    parser.add_argument("--appends", type=int, default=20, help="timed single-event commits per store")
    args = parser.parse_args()

    from deploy.runtime.redis_server import redis_binary

    work = Path(tempfile.mkdtemp(prefix="object-store-bench-"))
    s3_port, redis_port = _free_port(), _free_port()
    endpoint = f"http://127.0.0.1:{s3_port}"
    moto = _start([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(s3_port)], f"{endpoint}/moto-api/")
    redis_server = subprocess.Popen([str(redis_binary()), "--port", str(redis_port), "--bind", "127.0.0.1",
                                     "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL)
    try:
        _run(args, work, endpoint, f"redis://127.0.0.1:{redis_port}/0")
    finally:
        moto.terminate()
        redis_server.terminate()
        moto.wait(10)
        redis_server.wait(10)


def _run(args: argparse.Namespace, work: Path, endpoint: str, redis_url: str) -> None:
    import boto3

    from batch_layer.master.dataset import MasterDataset
    from batch_layer.recompute.job import run_batch
    from deploy.runtime.spark import build_spark
    from deploy.settings import load_settings
    from shared_logic import load_pipeline

    bucket = f"bench-{uuid.uuid4().hex[:8]}"
    boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=KEY_ID, aws_secret_access_key=SECRET,
                 region_name="us-east-1").create_bucket(Bucket=bucket)
    os.environ["LAMBDA_ENV_FILE"] = os.devnull
    common = {"pipeline": "payments", "redis_url": redis_url, "spark_master": "local[2]", "spark_shuffle_partitions": 2,
              "s3_endpoint_url": endpoint, "s3_region": "us-east-1", "s3_access_key_id": KEY_ID,
              "s3_secret_access_key": SECRET}
    stores = {
        "local": load_settings(data_dir=work / "local", **common),
        "s3": load_settings(data_dir=work / "s3", tables_uri=f"s3://{bucket}/lambda", **common),
    }
    pipeline = load_pipeline("payments")
    spark = build_spark(stores["s3"], "object-store-bench")  # S3A loaded; serves the local store too

    ingest: dict[str, list[float]] = {name: [] for name in stores}
    batch: dict[str, list[float]] = {name: [] for name in stores}
    appenders = {}
    for name, settings in stores.items():
        master = MasterDataset.open(settings, pipeline)
        master.append(_events(args.events, master.schema))
        appenders[name] = (master.appender(), _events(1, master.schema))
    for _ in range(args.appends + 1):  # the first round is a warm-up
        for name, (appender, event) in appenders.items():
            started = time.perf_counter()
            appender.append(event)
            ingest[name].append(time.perf_counter() - started)
    for _ in range(args.repeat + 1):
        for name, settings in stores.items():
            started = time.perf_counter()
            run_batch(spark, settings, pipeline, redis_url=redis_url)
            batch[name].append(time.perf_counter() - started)
    spark.stop()

    print(f"\nobject storage (moto S3 on loopback) vs local disk: {args.events} events, engine delta-rs")
    print(f"{'':28}{'local':>10}{'s3':>10}{'s3/local':>10}")
    for label, samples, unit, scale in (("single-event ingest commit", ingest, "ms", 1000),
                                         ("batch recompute", batch, "s", 1)):
        local, s3 = (statistics.median(samples[name][1:]) * scale for name in ("local", "s3"))
        print(f"{label:28}{local:>8.2f}{unit:>2}{s3:>8.2f}{unit:>2}{s3 / local:>10.2f}")


if __name__ == "__main__":
    main()
