"""The kafka commands' refusals: named, exit 2, and never showing a client option's value."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support import cli

_SECRET = "hunter2-not-for-output"


def test_feed_refuses_options_the_producer_cannot_use_without_showing_their_values(tmp_path: Path) -> None:
    for options in ({"sasl.jaas.config": f'x required password="{_SECRET}";'}, {"security.protocol": _SECRET}):
        done = cli(tmp_path, "kafka", "feed", "--demo", "3", LAMBDA_DATA_DIR=str(tmp_path / "data"),
                   LAMBDA_KAFKA_BOOTSTRAP_SERVERS="127.0.0.1:1", LAMBDA_KAFKA_TOPICS="t",
                   LAMBDA_KAFKA_OPTIONS=json.dumps(options))
        assert done.returncode == 2 and "LAMBDA_KAFKA_OPTIONS" in done.stderr, done.stderr
        assert _SECRET not in done.stdout + done.stderr


def test_kafka_commands_say_how_to_configure_kafka(tmp_path: Path) -> None:
    for command in (("kafka", "feed", "--demo", "3"), ("kafka", "ingest")):
        done = cli(tmp_path, *command, LAMBDA_DATA_DIR=str(tmp_path / "data"))
        assert done.returncode == 2 and "LAMBDA_KAFKA_BOOTSTRAP_SERVERS" in done.stderr, done.stderr
