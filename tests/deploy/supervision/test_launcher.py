"""`up` waiting for its embedded Kafka broker: the API, the speed layer and the scheduler run already, so a stop
asked meanwhile ends the wait at once (a clean stop: `up` then stops every part and exits 0), and a broker that
dies while starting is named with its log. The broker here is a stand-in process on a closed port; a real one
under `up` is the chaos test's (tests/chaos/test_chaos.py)."""

from __future__ import annotations

import io
import threading
from pathlib import Path

import pytest
from rich.console import Console

from deploy.errors import KafkaBrokerError
from deploy.settings import Settings, load_settings
from deploy.supervision.launcher import _await_broker
from deploy.supervision.supervisor import Child
from tests.support import free_port


def _settings(tmp_path: Path) -> Settings:
    return load_settings(data_dir=tmp_path, kafka_bootstrap_servers="embedded", kafka_topics="events",
                         kafka_embedded_port=free_port())


def _broker(tmp_path: Path, *argv: str) -> Child:
    broker = Child("kafka", list(argv), {}, tmp_path / "kafka.log", stop_last=True)
    broker.start()
    return broker


def test_a_stop_asked_while_up_waits_for_its_broker_ends_the_wait(tmp_path: Path) -> None:
    broker = _broker(tmp_path, "sleep", "120")  # alive, never answering
    stop = threading.Event()
    timer = threading.Timer(1.0, stop.set)
    timer.start()
    try:
        assert _await_broker(_settings(tmp_path), broker, tmp_path, Console(file=io.StringIO()), stop) is False
        assert broker.process is not None and broker.process.poll() is None, "stopping it is the supervisor's"
    finally:
        timer.cancel()
        broker.stop(grace=10)


def test_a_broker_that_dies_while_starting_is_named_with_its_log(tmp_path: Path) -> None:
    broker = _broker(tmp_path, "false")
    assert broker.process is not None
    broker.process.wait(30)
    with pytest.raises(KafkaBrokerError, match="did not start: see .*kafka.log"):
        _await_broker(_settings(tmp_path), broker, tmp_path, Console(file=io.StringIO()), threading.Event())
