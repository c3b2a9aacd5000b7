"""The embedded Kafka broker (``deploy.runtime.kafka_broker``): Apache Kafka's own broker, KRaft, one node.

Real everything: the broker's jars come from Maven Central (resolved once into the shared cache), the broker runs
in its own JVM on loopback, and records go through a real client (confluent-kafka). What a test expects is what
it produced, never what the broker says it has. The one thing faked is a download failure: the resolver is
pointed at a Maven repository URL where nothing listens.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

import psutil
import pytest

from deploy.errors import KafkaBrokerError, KafkaJarsError
from deploy.runtime.kafka_broker import KafkaBroker, running_pid
from deploy.runtime.kafka_jars import KAFKA_VERSION, kafka_jars
from tests.support import free_port
from tests.support.kafka import consume_all, create_topic, end_offsets, partition_count, produce, unique_topic


def _records(count: int, keys: int) -> list[tuple[bytes, bytes]]:
    """``count`` records over ``keys`` keys, each value unique (its index), some non-ASCII."""
    return [(f"key-{i % keys}".encode(), f"value-{i}-é".encode()) for i in range(count)]


@pytest.mark.slow  # over 10 s: the end-to-end tier
def test_records_produced_to_three_partitions_are_consumed_back_exactly(kafka_broker: str) -> None:
    topic = unique_topic()
    create_topic(kafka_broker, topic, partitions=3)
    assert partition_count(kafka_broker, topic) == 3

    sent = _records(600, keys=40)
    acknowledged = produce(kafka_broker, topic, sent)
    read = consume_all(kafka_broker, topic, partitions=3)

    # Exactly what was sent: each record once, none lost, none extra.
    assert Counter((r.key, r.value) for r in read) == Counter(sent)
    assert sum(end_offsets(kafka_broker, topic, 3).values()) == len(sent)
    # Spread over all three partitions, each a gapless sequence of offsets.
    by_partition: dict[int, list[int]] = defaultdict(list)
    for r in read:
        by_partition[r.partition].append(r.offset)
    assert sorted(by_partition) == [0, 1, 2]
    assert all(offsets == list(range(len(offsets))) for offsets in by_partition.values())
    # A key's records stay in one partition, in the order they were sent.
    for key in {k for k, _ in sent}:
        assert [r.value for r in read if r.key == key] == [v for k, v in sent if k == key]
        assert len({r.partition for r in read if r.key == key}) == 1
    # What the producer was told (partition, offset) is where the records are.
    assert sorted((a.partition, a.offset, a.key, a.value) for a in acknowledged) == \
        sorted((r.partition, r.offset, r.key, r.value) for r in read)


def test_a_taken_port_is_named_before_any_jvm_starts(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(KafkaBrokerError, match=f"port {port} on 127.0.0.1 is in use"):
            KafkaBroker(tmp_path / "kafka", port=port).start()
    assert not (tmp_path / "kafka").exists()


def test_an_unreachable_maven_repository_is_a_clear_error_and_leaves_nothing(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    repository = f"http://127.0.0.1:{free_port()}/maven2/"  # nothing listens there
    with pytest.raises(KafkaJarsError) as raised:
        kafka_jars(cache, repository=repository, timeout=300)
    message = str(raised.value)
    assert f"org.apache.kafka:kafka_2.13:{KAFKA_VERSION}" in message
    assert f"{repository} (unreachable: " in message and "--repository" in message
    assert sorted(p.name for p in cache.iterdir()) == [".resolve.lock"]  # no half-resolved folder


def test_the_command_line_explains_itself() -> None:
    done = subprocess.run([sys.executable, "-m", "deploy.runtime.kafka_broker", "--help"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    for option in ("--dir", "--port", "--cache", "--repository", "--resolve-only"):
        assert option in done.stdout


@pytest.mark.slow
@pytest.mark.uses_kafka
def test_the_command_line_runs_a_broker_until_ctrl_c_and_a_restart_keeps_the_data(tmp_path: Path) -> None:
    """Ctrl-C stops the command's broker and leaves no process; the broker started again on the same folder and
    port (``KafkaBroker``, as `up` starts it) does not format its storage again: the record is still there."""
    folder, port, controller_port = tmp_path / "data" / "kafka", free_port(), free_port()
    command = subprocess.Popen([sys.executable, "-m", "deploy.runtime.kafka_broker", "--dir", str(folder),
                                "--port", str(port), "--controller-port", str(controller_port)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    topic = unique_topic()
    try:
        assert command.stdout is not None
        ready = command.stdout.readline()  # printed once the broker answers
        assert f"bootstrap.servers=127.0.0.1:{port}" in ready, command.stderr.read() if command.stderr else ready
        create_topic(f"127.0.0.1:{port}", topic, partitions=1)
        produce(f"127.0.0.1:{port}", topic, [(b"k", b"kept across a restart")])
        cluster_id = (folder / "data" / "meta.properties").read_text()
        broker_pid = running_pid(folder)
        assert broker_pid is not None
        os.kill(command.pid, signal.SIGINT)
        assert command.wait(60) == 0
        assert not psutil.pid_exists(broker_pid) and running_pid(folder) is None
        assert not [p.pid for p in psutil.process_iter(["cmdline"]) if str(folder) in " ".join(p.info["cmdline"] or ())]
    finally:
        if command.poll() is None:
            command.kill()
            command.wait()

    broker = KafkaBroker(folder, port=port, controller_port=controller_port)
    with broker:
        assert broker.process is not None and running_pid(folder) == broker.process.pid
        pid = broker.process.pid
        assert [(r.key, r.value) for r in consume_all(broker.bootstrap, topic, partitions=1)] == \
            [(b"k", b"kept across a restart")]
        assert (folder / "data" / "meta.properties").read_text() == cluster_id
        assert broker.stop()  # it was running
    assert not psutil.pid_exists(pid) and running_pid(folder) is None
    assert not broker.stop()  # stopped already
