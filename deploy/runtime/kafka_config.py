"""What the embedded Kafka broker (``deploy.runtime.kafka_broker``) is started from: its ``server.properties``, its
logging configuration and the cluster id its storage is formatted with. Text only: nothing here starts a process."""

from __future__ import annotations

import base64
import uuid
from pathlib import Path

#: The broker listens on loopback only.
HOST = "127.0.0.1"


def server_properties(folder: Path, port: int, controller_port: int) -> str:
    """The broker's configuration: one node as broker and controller, loopback listeners, replication factors 1,
    small internal topics and thread pools (a 2-core machine)."""
    return "\n".join([
        "process.roles=broker,controller",
        "node.id=1",
        f"controller.quorum.voters=1@{HOST}:{controller_port}",
        f"listeners=PLAINTEXT://{HOST}:{port},CONTROLLER://{HOST}:{controller_port}",
        f"advertised.listeners=PLAINTEXT://{HOST}:{port}",
        "controller.listener.names=CONTROLLER",
        "inter.broker.listener.name=PLAINTEXT",
        "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        f"log.dirs={folder / 'data'}",
        "num.partitions=1",
        "default.replication.factor=1",
        "offsets.topic.replication.factor=1",
        "offsets.topic.num.partitions=5",
        "transaction.state.log.replication.factor=1",
        "transaction.state.log.min.isr=1",
        "transaction.state.log.num.partitions=5",
        "share.coordinator.state.topic.replication.factor=1",
        "share.coordinator.state.topic.min.isr=1",
        "group.initial.rebalance.delay.ms=0",
        "num.network.threads=2",
        "num.io.threads=2",
        "background.threads=2",
        "num.recovery.threads.per.data.dir=1",
        "",
    ])


#: The broker's log4j2 configuration: its own lines at INFO, the request and state-change loggers at WARN.
LOG4J2 = """\
status = warn
shutdownHook = disable
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = out
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.change.name = state.change.logger
logger.change.level = WARN
"""


def new_cluster_id() -> str:
    """A random KRaft cluster id: 16 random bytes in URL-safe base64, never starting with ``-``. Kafka's own
    ``Uuid.randomUuid`` draws again for those too: its command line would read the id as an option (``kafka-storage
    format -t -Xy...`` fails with "expected one argument"; one id in 64 starts so)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id
