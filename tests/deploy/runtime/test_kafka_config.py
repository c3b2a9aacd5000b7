"""What the embedded broker is started from (``deploy.runtime.kafka_config``); the broker itself is
``test_kafka_broker.py``'s."""

from __future__ import annotations

import base64

from deploy.runtime.kafka_config import new_cluster_id


def test_a_cluster_id_is_16_bytes_and_never_reads_as_an_option() -> None:
    """One id in 64 drawn as URL-safe base64 starts with ``-``, which ``kafka-storage format -t`` read as an option
    (a session broker failed to format so, run 24); Kafka's own ``Uuid.randomUuid`` draws again for those."""
    ids = [new_cluster_id() for _ in range(5000)]
    assert not [i for i in ids if i.startswith("-")]
    assert {len(base64.urlsafe_b64decode(i + "==")) for i in ids} == {16} and len(set(ids)) == len(ids)
