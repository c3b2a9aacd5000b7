"""The Kafka settings: topics per pipeline, the embedded broker's address, and client options that stay secret."""

from __future__ import annotations

import json
import traceback
from pathlib import Path

import pytest

from deploy.errors import ConfigError
from deploy.runtime.kafka_ingester import kafka_source
from deploy.settings import load_settings

_SECRET = "s3cr3t-jaas-password-value"


def test_no_kafka_unless_brokers_are_set(tmp_path: Path) -> None:
    settings = load_settings(data_dir=tmp_path)
    assert settings.kafka_bootstrap is None and kafka_source(settings) is None


def test_a_plain_topic_list_is_the_default_pipeline_s_and_others_read_nothing(tmp_path: Path) -> None:
    settings = load_settings(data_dir=tmp_path, pipelines="wordcount,payments", kafka_bootstrap_servers="embedded",
                             kafka_topics="words, more", kafka_embedded_port=9199)
    words = kafka_source(settings.for_pipeline("wordcount"))
    assert words is not None and words.topics == ("words", "more") and words.bootstrap_servers == "127.0.0.1:9199"
    assert kafka_source(settings.for_pipeline("payments")) is None


def test_topics_by_pipeline_and_by_pattern(tmp_path: Path) -> None:
    settings = load_settings(data_dir=tmp_path, pipelines="wordcount,payments", kafka_bootstrap_servers="k1:9092,k2:9092",
                             kafka_topics=json.dumps({"payments": "pattern:pay-.*", "wordcount": "words"}))
    payments = kafka_source(settings.for_pipeline("payments"))
    assert payments is not None and payments.pattern == "pay-.*" and payments.bootstrap_servers == "k1:9092,k2:9092"


@pytest.mark.parametrize(("values", "named"), [
    ({"kafka_topics": "words"}, "LAMBDA_KAFKA_BOOTSTRAP_SERVERS is not"),
    ({"kafka_bootstrap_servers": "k:9092"}, "set LAMBDA_KAFKA_TOPICS"),
    ({"kafka_bootstrap_servers": "k:9092", "kafka_topics": '{"nope": "t"}'}, "does not run: nope"),
    ({"kafka_bootstrap_servers": "k:9092", "kafka_topics": '{"wordcount": "t"', }, "LAMBDA_KAFKA_TOPICS: is not valid JSON"),
    ({"kafka_bootstrap_servers": "k:9092", "kafka_topics": "t", "kafka_starting_offsets": "middle"},
     "LAMBDA_KAFKA_STARTING_OFFSETS"),
])
def test_settings_that_do_not_fit_together_are_refused_by_name(tmp_path: Path, values: dict[str, str],
                                                                named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        load_settings(data_dir=tmp_path, **values)


def test_client_options_reach_the_source_and_nothing_else(tmp_path: Path) -> None:
    options = json.dumps({"sasl.jaas.config": f"password={_SECRET}"})
    settings = load_settings(data_dir=tmp_path, kafka_bootstrap_servers="k:9092", kafka_topics="t",
                             kafka_options=options)
    source = kafka_source(settings)
    assert source is not None and source.reader_options()["kafka.sasl.jaas.config"] == f"password={_SECRET}"
    assert _SECRET not in repr(settings) and _SECRET not in repr(source) and _SECRET not in source.described
    with pytest.raises(ConfigError) as raised:
        load_settings(data_dir=tmp_path, kafka_bootstrap_servers="k:9092", kafka_topics="t",
                      kafka_options=json.dumps({"sasl.jaas.config": 5, "x": _SECRET}) + "}")
    assert _SECRET not in "".join(traceback.format_exception(raised.value))


def test_up_hands_its_children_the_client_options_themselves(tmp_path: Path) -> None:
    """``up`` passes every setting to its children as LAMBDA_* variables: the Kafka client options (secrets
    inside a JSON object) arrive as the secrets, and read back as the same settings."""
    from deploy.supervision.launcher import _env

    options = {"sasl.jaas.config": f"password={_SECRET}", "security.protocol": "SASL_SSL"}
    settings = load_settings(data_dir=tmp_path, kafka_bootstrap_servers="k:9092", kafka_topics="t",
                             kafka_options=json.dumps(options))
    env = _env(settings, "redis://localhost:6379/0")
    assert json.loads(env["LAMBDA_KAFKA_OPTIONS"]) == options
    assert json.loads(env["LAMBDA_KAFKA_TOPICS"]) == {"wordcount": "t"}
    child = load_settings(kafka_bootstrap_servers=env["LAMBDA_KAFKA_BOOTSTRAP_SERVERS"],
                          kafka_topics=env["LAMBDA_KAFKA_TOPICS"], kafka_options=env["LAMBDA_KAFKA_OPTIONS"])
    assert child.kafka_client_options() == options
