"""The ``kafka`` commands: ``kafka ingest`` (topics into the master, exactly once), ``kafka feed`` (a file or
demo events into a topic) and ``kafka broker`` (the embedded one-node broker, in the foreground)."""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from rich.markup import escape

from deploy.cli.exits import EXIT_FAILED, EXIT_OK
from deploy.errors import ConfigError
from deploy.settings import Settings
from deploy.terminal import console

if TYPE_CHECKING:
    from confluent_kafka import Producer

_NOT_CONFIGURED = ("Kafka is not configured: set LAMBDA_KAFKA_BOOTSTRAP_SERVERS (brokers, or 'embedded') and "
                   "LAMBDA_KAFKA_TOPICS (README, \"Kafka\")")


def add_kafka_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    kafka = sub.add_parser("kafka", help="Kafka: ingest topics into the master, feed a topic, run a local broker")
    kafka_sub = kafka.add_subparsers(dest="kafka_command", required=True, metavar="COMMAND")
    ingest = kafka_sub.add_parser(
        "ingest", help="read the pipelines' topics into their master datasets, exactly once, until Ctrl-C",
        description="One Spark application reads each pipeline's topics (LAMBDA_KAFKA_TOPICS) with Spark's Kafka "
                    "source and appends valid events to the pipeline's master dataset, one commit per micro-batch; "
                    "invalid records go to the dead letters with their topic, partition and offset. Offsets live "
                    "in DATA_DIR/checkpoints/<pipeline>/kafka-ingest: a restart resumes there, and a micro-batch "
                    "replayed after a crash is kept once. `up` runs it when Kafka is configured.")
    ingest.set_defaults(handler=ingest_topics)
    feed = kafka_sub.add_parser(
        "feed", help="produce events to a topic: JSON Lines files, or the demo's sample events",
        description="Each non-blank line of each FILE (or each of --demo N sample events of a built-in pipeline) "
                    "becomes one record (idempotent producer: a retry is not a duplicate). The topic defaults to "
                    "the pipeline's first topic in LAMBDA_KAFKA_TOPICS.")
    feed.add_argument("files", type=Path, nargs="*", metavar="FILE", help="JSON Lines file: one event per line")
    feed.add_argument("--demo", type=int, metavar="N", help="produce N sample events of the pipeline instead")
    feed.add_argument("--topic", help="topic to produce to (default: the pipeline's first topic)")
    feed.set_defaults(handler=feed_topic)
    broker = kafka_sub.add_parser(
        "broker", help="run the embedded one-node Kafka broker (DATA_DIR/kafka) in the foreground until Ctrl-C",
        description="Apache Kafka's own broker (KRaft, one node) from Maven Central's jars (resolved once, about a "
                    "minute), listening on 127.0.0.1:LAMBDA_KAFKA_EMBEDDED_PORT (9092).")
    broker.set_defaults(handler=run_broker)


def ingest_topics(settings: Settings, args: argparse.Namespace) -> int:
    from batch_layer.master.kafka_ingest import kafka_package
    from deploy.cli.layer_commands import run_per_pipeline_app
    from deploy.runtime.kafka_broker import answers
    from deploy.runtime.kafka_ingester import run_kafka_ingest

    if settings.kafka_bootstrap is None:
        raise ConfigError(_NOT_CONFIGURED)
    if settings.kafka_embedded and not answers(settings.kafka_bootstrap):
        raise ConfigError(f"the embedded Kafka broker does not answer on {settings.kafka_bootstrap}: start it "
                          "(`lambda-platform kafka broker`, or `up`, which runs it)")
    return run_per_pipeline_app(settings, args, "kafka-ingest", "kafka ingest", run_kafka_ingest,
                                packages=(kafka_package(),))


def feed_topic(settings: Settings, args: argparse.Namespace) -> int:
    from confluent_kafka import KafkaException, Producer

    bootstrap = settings.kafka_bootstrap
    if bootstrap is None:
        raise ConfigError(_NOT_CONFIGURED)
    topic = args.topic or next(iter(settings.kafka_topics_of(settings.pipeline)[0]), None)
    if topic is None:
        raise ConfigError(f"no topic to feed: give --topic, or name pipeline {settings.pipeline}'s topics in "
                          "LAMBDA_KAFKA_TOPICS (a pattern names no topic to produce to)")
    if bool(args.files) == (args.demo is not None):
        raise ConfigError("give either FILE... or --demo N")
    options = settings.kafka_client_options()
    try:  # librdkafka's own lines (a retry while a fresh broker loads its coordinator...): errors only, all with -v
        producer = Producer({**options, "bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 20,
                             "log_level": 7 if args.verbose else 3}, logger=logging.getLogger("librdkafka"))
    except KafkaException as e:  # librdkafka quotes a bad value: never show an option's value
        raise ConfigError(f"LAMBDA_KAFKA_OPTIONS: the producer refuses them ({_unquoted(str(e), options)}); `kafka "
                          "feed` uses librdkafka, whose names differ from the Java client's in places (no "
                          "sasl.jaas.config: sasl.username and sasl.password)") from None
    failures: list[str] = []
    sent = 0
    try:
        for value in _values(settings, args):
            _produce(producer, topic, value, failures)
            sent += 1
        left = producer.flush(60)
    except KafkaException as e:
        console.print(f"[red]cannot produce to {escape(topic)} on {escape(bootstrap)}[/]: {escape(str(e))}")
        return EXIT_FAILED
    if failures or left:
        console.print(f"[red]{len(failures) + left} of {sent} records not delivered to {escape(topic)}[/]: "
                      f"{escape(failures[0] if failures else 'timed out')}")
        return EXIT_FAILED
    console.print(f"[green]produced {sent} records[/] to topic {escape(topic)} on {escape(bootstrap)}")
    return EXIT_OK


def _unquoted(message: str, options: dict[str, str]) -> str:
    for value in sorted(options.values(), key=len, reverse=True):
        if value:
            message = message.replace(value, "***")
    return message


def _produce(producer: Producer, topic: str, value: bytes, failures: list[str]) -> None:
    def delivered(error: object, _message: object) -> None:
        if error is not None:
            failures.append(str(error))

    while True:
        try:
            producer.produce(topic, value=value, on_delivery=delivered)
            return
        except BufferError:  # the local queue is full: let it drain
            producer.poll(0.5)


def _values(settings: Settings, args: argparse.Namespace) -> Iterator[bytes]:
    if args.demo is not None:
        from deploy.demo.samples import sample_events

        events = sample_events(settings.pipeline, args.demo)
        if events is None:
            raise ConfigError(f"pipeline {settings.pipeline} has no demo events: feed a file instead")
        yield from (json.dumps(event).encode() for event in events)
        return
    for file in args.files:
        if not file.is_file():
            raise ConfigError(f"cannot feed {file}: no such file")
        with file.open("rb") as lines:
            yield from (line.rstrip(b"\r\n") for line in lines if line.strip())


def run_broker(settings: Settings, args: argparse.Namespace) -> int:
    from deploy.runtime.kafka_broker import main

    folder = settings.data_dir.resolve() / "kafka"
    return main(["--dir", str(folder), "--port", str(settings.kafka_embedded_port)])
