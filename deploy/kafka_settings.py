"""The Kafka settings (``LAMBDA_KAFKA_*``), a part of ``deploy.settings.Settings``.

Unset ``LAMBDA_KAFKA_BOOTSTRAP_SERVERS`` means no Kafka: nothing starts and nothing changes. The
client options may hold secrets (SASL passwords): they are ``SecretStr``, never in a log, an error,
``status`` or ``--help``; they leave this object only as the Spark source's options.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode

from deploy import setting_checks as check
from deploy.errors import ConfigError

#: ``LAMBDA_KAFKA_BOOTSTRAP_SERVERS`` naming the local broker ``up`` and ``kafka broker`` run under the data dir.
EMBEDDED = "embedded"
_PATTERN = "pattern:"


class KafkaSettings(BaseSettings):
    """Where events come from when they come from Kafka (``lambda-platform kafka ingest``, run by ``up``)."""

    kafka_bootstrap_servers: str | None = Field(
        None, description="Kafka brokers to ingest from (host:port[,host:port...]), or 'embedded' for a local "
                          "one-node broker under the data dir (started by `up` and `kafka broker`). Unset: no Kafka.")
    kafka_topics: Annotated[dict[str, str], NoDecode] = Field(
        default_factory=dict, description='Topics per pipeline as JSON, {"payments": "payments,refunds"} or '
        '{"payments": "pattern:pay-.*"} (a Java regex); a plain value is the default pipeline\'s topics.')
    kafka_starting_offsets: Literal["earliest", "latest"] = Field(
        "earliest", description="Where a new ingest query starts in each partition (later: from its checkpoint).")
    kafka_max_offsets_per_trigger: int = Field(
        20_000, ge=1, description="Most records one micro-batch of the ingest reads: with the 64 KiB cap of one "
                                  "record (larger ones are dead letters, cut to 64 KiB) it bounds the batch the "
                                  "driver collects, at worst records x 64 KiB (20,000: 1.25 GiB, over Spark's "
                                  "default spark.driver.maxResultSize of 1 GiB): lower it before records near "
                                  "the cap come in bulk (a logged batch is replayed as it was read).")
    kafka_trigger_seconds: float = Field(
        0.5, ge=0.05, le=3600, description="How often the ingest looks for new records (seconds).")
    kafka_options: Annotated[dict[str, SecretStr], NoDecode] = Field(
        default_factory=dict, description='Kafka client settings passed through, as JSON: {"security.protocol": '
        '"SASL_SSL", "sasl.mechanism": "PLAIN", "sasl.jaas.config": "..."}. Values are secret (never shown).')
    kafka_embedded_port: int = Field(9092, ge=1, le=65535, description="The embedded broker's port on 127.0.0.1.")

    @field_validator("kafka_topics", mode="before")
    @classmethod
    def _decode_topics(cls, value: object) -> object:
        if isinstance(value, str):
            text = value.strip()
            if not text:
                return {}
            if not text.startswith("{"):
                return {"": text}  # the default pipeline's, named once the pipelines are known
            return check.json_object(text, '{"payments": "payments,refunds"}')
        return value

    @field_validator("kafka_options", mode="before")
    @classmethod
    def _decode_options(cls, value: object) -> object:
        if isinstance(value, str):
            return check.json_object(value, '{"security.protocol": "SASL_SSL"}') if value.strip() else {}
        return value

    def check_kafka(self, pipelines: tuple[str, ...]) -> None:
        """The Kafka settings fit together and name known pipelines (ValueError: pydantic reports it); a plain
        LAMBDA_KAFKA_TOPICS becomes the default pipeline's (``pipelines[0]``)."""
        if "" in self.kafka_topics:
            topics = {pipelines[0]: self.kafka_topics[""], **{k: v for k, v in self.kafka_topics.items() if k}}
            object.__setattr__(self, "kafka_topics", topics)  # frozen: set once, while validating
        if self.kafka_topics and not self.kafka_bootstrap:
            raise ValueError("LAMBDA_KAFKA_TOPICS is set but LAMBDA_KAFKA_BOOTSTRAP_SERVERS is not: set the brokers "
                             "(or 'embedded'), or unset the topics")
        if self.kafka_bootstrap and not self.kafka_topics:
            raise ValueError("LAMBDA_KAFKA_BOOTSTRAP_SERVERS is set but no topic is: set LAMBDA_KAFKA_TOPICS, e.g. "
                             '{"' + pipelines[0] + '": "events"}')
        unknown = sorted(set(self.kafka_topics) - set(pipelines) - {""})
        if unknown:
            raise ValueError(f"LAMBDA_KAFKA_TOPICS names pipelines this deployment does not run: {', '.join(unknown)}; "
                             f"it runs {', '.join(pipelines)}")

    @property
    def kafka_bootstrap(self) -> str | None:
        """The brokers to read: the configured list, the embedded broker's address, or None (no Kafka)."""
        servers = (self.kafka_bootstrap_servers or "").strip()
        if not servers:
            return None
        return f"127.0.0.1:{self.kafka_embedded_port}" if servers == EMBEDDED else servers

    @property
    def kafka_embedded(self) -> bool:
        return (self.kafka_bootstrap_servers or "").strip() == EMBEDDED

    def kafka_topics_of(self, pipeline: str) -> tuple[tuple[str, ...], str | None]:
        """(topic names, pattern) pipeline ``pipeline`` reads (none: it reads no Kafka topic)."""
        spec = self.kafka_topics.get(pipeline)
        if not spec:
            return (), None
        if spec.startswith(_PATTERN):
            return (), spec[len(_PATTERN):]
        topics = tuple(t.strip() for t in spec.split(",") if t.strip())
        if not topics:
            raise ConfigError(f"LAMBDA_KAFKA_TOPICS: pipeline {pipeline!r} names no topic")
        return topics, None

    def kafka_client_options(self) -> dict[str, str]:
        """The client options in clear, for the Spark source and the producer only (never for output)."""
        return {name: value.get_secret_value() for name, value in self.kafka_options.items()}
