"""A real Kafka broker for tests (Apache Kafka's own, KRaft, one node, ``deploy.runtime.kafka_broker``) and helpers
that talk to it with a real client from PyPI (``confluent-kafka``: librdkafka, bundled in its wheel).

The broker's jars are resolved once into the shared cache (``~/.cache/lambda-platform/kafka/<version>/``) under
the resolver's own lock file, so two xdist workers never resolve at once: the first resolves, the other waits
and reads the cache. Records go through the client as bytes; what a test expects is what it produced.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from deploy.runtime.kafka_broker import KafkaBroker


@dataclass(frozen=True)
class Record:
    """One record as the broker stored it: its coordinates, key and value."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


@contextmanager
def kafka_broker_in(folder: Path) -> Iterator[KafkaBroker]:
    """A broker with its files in ``folder`` on free loopback ports, stopped when the block ends."""
    with KafkaBroker(folder) as broker:
        yield broker


def unique_topic(prefix: str = "test") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def create_topic(bootstrap: str, topic: str, partitions: int, timeout: float = 60) -> None:
    """Create ``topic`` (replication factor 1) and wait until the broker confirms it."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)],
                                  operation_timeout=timeout, request_timeout=timeout)
    futures[topic].result(timeout)


def partition_count(bootstrap: str, topic: str, timeout: float = 30) -> int:
    """How many partitions the broker's metadata gives ``topic``."""
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=timeout)
    described = metadata.topics[topic]
    if described.error is not None:
        raise AssertionError(f"topic {topic}: {described.error}")
    return len(described.partitions)


def produce(bootstrap: str, topic: str, records: Sequence[tuple[bytes, bytes]], timeout: float = 60) -> list[Record]:
    """Send ``(key, value)`` records with an idempotent producer (acks=all) and wait for every acknowledgement;
    the records as acknowledged (their partition and offset), in the order sent."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                         "linger.ms": 5})
    acknowledged: dict[int, Record] = {}
    errors: list[str] = []

    def on_delivery(index: int, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            errors.append(f"record {index}: {err}")
        else:
            acknowledged[index] = Record(msg.partition(), msg.offset(), msg.key(), msg.value())

    for index, (key, value) in enumerate(records):
        producer.produce(topic, key=key, value=value, on_delivery=partial(on_delivery, index))
        producer.poll(0)
    left = producer.flush(timeout)
    assert left == 0 and not errors, f"{left} records unacknowledged after {timeout}s; errors: {errors[:5]}"
    return [acknowledged[i] for i in range(len(records))]


def end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    """Each partition's high watermark (the offset after its last record)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique_topic("watermarks")})
    try:
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in range(partitions)}
    finally:
        consumer.close()


def consume_all(bootstrap: str, topic: str, partitions: int, timeout: float = 60) -> list[Record]:
    """Every record of ``topic`` from the beginning up to each partition's current end (read_committed), in the
    order each partition returned them. No consumer group membership: the partitions are assigned directly."""
    ends = end_offsets(bootstrap, topic, partitions)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique_topic("reader"),
                         "enable.auto.commit": False, "isolation.level": "read_committed"})
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    records: list[Record] = []
    positions = dict.fromkeys(range(partitions), 0)
    deadline = time.monotonic() + timeout
    try:
        while any(positions[p] < ends[p] for p in range(partitions)):
            if time.monotonic() > deadline:
                raise AssertionError(f"read {len(records)} records of {topic} in {timeout}s; positions {positions}, "
                                     f"ends {ends}")
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error() is not None:
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    continue
                raise AssertionError(f"consuming {topic}: {msg.error()}")
            records.append(Record(msg.partition(), msg.offset(), msg.key(), msg.value()))
            positions[msg.partition()] = msg.offset() + 1
    finally:
        consumer.close()
    return records
