"""Kafka -> master throughput: our exactly-once ingest against Spark's own Kafka -> Delta query, same topic, same trigger.

    python benchmarks/kafka_ingest_bench.py [--records 200000 --partitions 4 --repeat 2 --idle-seconds 20]

A local broker (Apache Kafka's own, ``deploy.runtime.kafka_broker``) holds one topic of ``--records``
wordcount events (JSON, about 70 bytes each) over ``--partitions`` partitions. Each run reads the whole
topic from a fresh checkpoint with ``trigger(availableNow=True)`` and the same cap per micro-batch
(``--max-offsets``), in one SparkSession, alternating:

- peer: what a user would write without validation: ``readStream.format("kafka")`` -> value as string
  plus topic/partition/offset/timestamp -> ``writeStream.format("delta")`` (JVM Delta, delta-spark).
- ours: ``batch_layer.master.kafka_ingest`` on the default engine (delta-rs): every record validated by
  the pipeline's event model, one master commit per micro-batch carrying its application transaction,
  bad records to dead letters.

Prints records/s of each (median of ``--repeat`` runs after ``--warmup`` rounds not counted: a JVM's
first Kafka read and first Delta write cost seconds of class loading and JIT; the query's start is
included) and ours / peer
(target >= 0.8x), then the CPU our ingest burns idle (a processingTime trigger at the default 0.5 s,
nothing to read) over ``--idle-seconds``: the whole process tree's, in cores. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import cpu_seconds, print_medians, tree_cpu_seconds, write_figures
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from batch_layer.master.dataset import MasterDataset
from batch_layer.master.dead_letters import DeadLetters
from batch_layer.master.engines import get_engine
from batch_layer.master.kafka_ingest import KafkaSource, kafka_package, start_ingest
from deploy.runtime.kafka_broker import KafkaBroker
from deploy.settings import load_settings
from shared_logic.registry import load_pipeline

_WORDS = ("lambda", "kappa", "delta", "spark", "kafka", "redis", "exact", "merge", "batch", "speed")


def _fill(bootstrap: str, topic: str, records: int, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})  # held: a client collected mid-call cancels the call
    admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])[topic].result(60)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "batch.size": 1 << 20,
                         "queue.buffering.max.messages": 1_000_000})
    for i in range(records):
        value = json.dumps({"text": f"{_WORDS[i % 10]} {_WORDS[(i // 10) % 10]} {i}",
                            "event_time": f"2026-05-01T{(i // 3600) % 24:02d}:{(i // 60) % 60:02d}:{i % 60:02d}Z"})
        while True:
            try:
                producer.produce(topic, value=value.encode(), partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.2)
    assert producer.flush(120) == 0, "records not delivered"


def _peer(spark: Any, source: KafkaSource, folder: Path) -> float:
    frame = spark.readStream.format("kafka").options(**source.reader_options()).load()
    rows = frame.selectExpr("CAST(value AS STRING) AS value", "topic", "partition", "offset", "timestamp")
    started = time.perf_counter()
    query = (rows.writeStream.format("delta").option("checkpointLocation", str(folder / "checkpoint"))
             .trigger(availableNow=True).start(str(folder / "table")))
    query.awaitTermination()
    return time.perf_counter() - started


def _ours(spark: Any, source: KafkaSource, folder: Path) -> tuple[float, int]:
    pipeline = load_pipeline("wordcount")
    engine = get_engine("delta-rs")
    master = MasterDataset(str(folder / "master"), pipeline, engine)
    dead = DeadLetters(str(folder / "dead_letters"), pipeline.name, engine)
    started = time.perf_counter()
    query, writer = start_ingest(spark, master, dead, source, checkpoint=folder / "checkpoint", trigger_seconds=0.5,
                                 available_now=True)
    query.awaitTermination()
    return time.perf_counter() - started, writer.totals.appended


def _idle_cores(spark: Any, source: KafkaSource, folder: Path, seconds: float, broker_pid: int) -> float:
    """Cores this process tree (the broker's JVM left out) burns with our ingest running and nothing new to read."""
    import psutil

    broker = psutil.Process(broker_pid)

    def ours() -> float:
        return tree_cpu_seconds() - cpu_seconds(broker)

    pipeline = load_pipeline("wordcount")
    engine = get_engine("delta-rs")
    master = MasterDataset(str(folder / "master"), pipeline, engine)
    query, _ = start_ingest(spark, master, DeadLetters(str(folder / "dl"), pipeline.name, engine), source,
                            checkpoint=folder / "checkpoint", trigger_seconds=0.5)
    while query.lastProgress is None or query.lastProgress.get("numInputRows", 1) > 0:
        time.sleep(0.5)  # caught up: the last trigger read nothing
    cpu0, t0 = ours(), time.perf_counter()
    time.sleep(seconds)
    cores = (ours() - cpu0) / (time.perf_counter() - t0)
    query.stop()
    return cores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--max-offsets", type=int, default=100_000, help="records per micro-batch, both queries")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1, help="rounds of both first, not counted")
    parser.add_argument("--idle-seconds", type=float, default=20.0)
    parser.add_argument("--json", type=Path, help="write the figures here (benchmarks/suite.py reads them)")
    args = parser.parse_args()

    from deploy.runtime.spark import build_spark

    work = Path(tempfile.mkdtemp(prefix="lambda-kafka-bench-"))
    try:
        with KafkaBroker(work / "broker") as broker:
            topic = "bench-events"
            print(f"filling {topic}: {args.records:,} records over {args.partitions} partitions", flush=True)
            _fill(broker.bootstrap, topic, args.records, args.partitions)
            settings = load_settings(data_dir=work / "data", storage_engine="delta-spark", spark_master="local[2]",
                                     spark_shuffle_partitions=2)
            spark = build_spark(settings, "kafka-ingest-bench", packages=(kafka_package(),),
                                log_file=work / "spark.log", echo=False)
            source = KafkaSource(broker.bootstrap, topics=(topic,), max_offsets_per_trigger=args.max_offsets)
            runs: dict[str, list[float]] = {"peer: Kafka -> Delta, no validation": [], "ours: validated, exactly once": []}
            for round_ in range(-args.warmup, args.repeat):  # negative rounds: warm-up, not counted
                peer = _peer(spark, source, work / f"peer-{round_}")
                ours, appended = _ours(spark, source, work / f"ours-{round_}")
                assert appended == args.records, f"ours appended {appended} of {args.records}"
                if round_ < 0:
                    print(f"  warm-up: peer {peer:.1f} s, ours {ours:.1f} s (the JVM's first Kafka and Delta work)")
                    continue
                runs["peer: Kafka -> Delta, no validation"].append(peer)
                runs["ours: validated, exactly once"].append(ours)
                print(f"  round {round_ + 1}: peer {peer:.1f} s, ours {ours:.1f} s", flush=True)
            med = print_medians(f"Kafka -> master, {args.records:,} records", runs,
                                baseline="peer: Kafka -> Delta, no validation", per_second=args.records)
            peer_rate, our_rate = (args.records / m for m in med.values())
            print(f"\nthroughput: ours {our_rate:,.0f} records/s, peer {peer_rate:,.0f} records/s, "
                  f"ours/peer {our_rate / peer_rate:.2f}x (target >= 0.8x)")
            assert broker.process is not None
            idle = _idle_cores(spark, source, work / "idle", args.idle_seconds, broker.process.pid)
            print(f"idle ingest: {idle:.3f} cores over {args.idle_seconds:g} s (its whole process tree)")
            spark.stop()
        if args.json:
            write_figures(args.json, "kafka_ingest", {"ours_records_per_s": our_rate, "peer_records_per_s": peer_rate,
                                                      "ours_over_peer": our_rate / peer_rate, "idle_cores": idle})
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
