"""A record produced to Kafka -> its merged answer over HTTP: p50/p95, beside an event appended to the master directly.

    python benchmarks/kafka_freshness_bench.py [--events 120 --rate 2 --idle-seconds 20]

A local broker, the Kafka ingest (``lambda-platform kafka ingest``, its trigger at the default 0.5 s),
the speed layer and the API run as in production (separate processes). Events alternate between two
paths, one at a time at ``--rate`` per second: a Kafka record (timed from the broker's acknowledgement)
and, as the baseline, a direct master append (timed from the commit: what the speed layer's own
freshness benchmark measures). For each, the time until the word is in the merged answer over HTTP.
Prints p50/p95/max of both, the Kafka path's p95 (target <= 1 s) and its ratio to the baseline's, then
the CPU the idle ingest (its process, JVM and Python workers) burns over ``--idle-seconds``.
Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import free_port, percentile, stop, wait_for, write_figures
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from speed_layer_bench import idle_cores

from batch_layer.master.dataset import MasterDataset
from batch_layer.master.engines import get_engine
from deploy.runtime.kafka_broker import KafkaBroker
from deploy.runtime.redis_server import ensure_embedded_redis, stop_embedded_redis
from deploy.settings import load_settings
from serving.store.connection import redis_client
from serving.store.ingest_status import IngestStatusRecord
from serving.store.keys import Keys
from shared_logic.registry import load_pipeline


def _produce_one(producer: Producer, topic: str, word: str) -> None:
    acked: list[object] = []
    producer.produce(topic, value=json.dumps({"text": word}).encode(), on_delivery=lambda err, _m: acked.append(err))
    while not acked:
        producer.poll(0.005)
    if acked[0] is not None:
        raise RuntimeError(f"record not acknowledged: {acked[0]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=120, help="events per path")
    parser.add_argument("--rate", type=float, default=2.0, help="events per second, both paths together")
    parser.add_argument("--idle-seconds", type=float, default=20.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="lambda-kafka-fresh-"))
    data_dir = work / "data"
    settings = load_settings(data_dir=data_dir, pipeline="wordcount")
    redis_url = ensure_embedded_redis(settings.redis_dir)
    pipeline = load_pipeline("wordcount")
    master = MasterDataset(settings.master_path, pipeline, get_engine("delta-rs"))
    master.append(pipeline.schema.validate([{"text": "warm up"}]))
    procs: list[subprocess.Popen[bytes]] = []
    with KafkaBroker(work / "broker") as broker:
        topic = "fresh-events"
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})  # held: collected mid-call, it cancels the call
        admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(60)
        port = free_port()
        env = {**os.environ, "LAMBDA_DATA_DIR": str(data_dir), "LAMBDA_PIPELINE": "wordcount",
               "LAMBDA_REDIS_URL": redis_url, "LAMBDA_HTTP_PORT": str(port),
               "LAMBDA_KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap, "LAMBDA_KAFKA_TOPICS": topic}
        cli = [sys.executable, "-m", "deploy.cli"]
        subprocess.run([*cli, "batch", "run"], env=env, check=True, capture_output=True)
        procs.extend(subprocess.Popen([*cli, *command], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                     for command in (["speed", "run"], ["serve"], ["kafka", "ingest"]))
        ingest = procs[-1]
        client = redis_client(redis_url)
        producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0, "acks": "all"})
        delays: dict[str, list[float]] = {"kafka": [], "master append": []}
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5) as http:
                wait_for(lambda: http.get("/readyz").status_code == 200, "the API", 120)
                wait_for(lambda: client.hget(Keys("wordcount").speed, "processed") is not None, "the speed layer", 180)
                status = IngestStatusRecord(client, Keys("wordcount").kafka)
                wait_for(lambda: (s := status.read()) is not None and s.state == "running", "the Kafka ingest", 240)

                def visible(word: str) -> bool:
                    return http.get(f"/v1/views/word_counts/keys/{word}").status_code == 200

                for i in range(3):  # warm-up: each path's first events are start-up
                    _produce_one(producer, topic, f"warmk{i}")
                    wait_for(lambda i=i: visible(f"warmk{i}"), "a warm-up record", 240)
                interval = 1.0 / args.rate
                for i in range(args.events * 2):
                    path = "kafka" if i % 2 == 0 else "master append"
                    word = f"fresh{i:05d}"
                    time.sleep(interval)
                    if path == "kafka":
                        _produce_one(producer, topic, word)
                    else:
                        master.append(pipeline.schema.validate([{"text": word}]))
                    acked = time.monotonic()
                    while not visible(word):
                        time.sleep(0.01)
                    delays[path].append(time.monotonic() - acked)
                time.sleep(3.0)
                idle = idle_cores(ingest.pid, args.idle_seconds)
        finally:
            for proc in reversed(procs):
                stop(proc, timeout=60)
            stop_embedded_redis(settings.redis_dir)
    figures: dict[str, float] = {"idle_cores": idle}
    print(f"record -> merged answer over HTTP, {args.events} events per path, one at a time, {args.rate:g}/s:")
    for path, values in delays.items():
        p50, p95 = statistics.median(values), percentile(values, 0.95)
        print(f"  {path:<14} p50 {p50:.3f} s   p95 {p95:.3f} s   max {max(values):.3f} s")
        figures[f"{path.split()[0]}_p50_s"], figures[f"{path.split()[0]}_p95_s"] = p50, p95
    ratio = figures["kafka_p95_s"] / figures["master_p95_s"]
    print(f"  Kafka p95 {figures['kafka_p95_s']:.3f} s (target <= 1 s), {ratio:.2f}x the direct append's")
    print(f"  idle Kafka ingest (process, JVM, Python workers): {idle:.3f} cores over {args.idle_seconds:g} s")
    if args.json:
        write_figures(args.json, "kafka_freshness", {**figures, "kafka_over_master_p95": ratio})


if __name__ == "__main__":
    main()
