"""Errors of the deploy package (configuration, launching processes)."""


class DeployError(Exception):
    """Root of every error raised by the deploy package."""


class ConfigError(DeployError):
    """A setting is missing or invalid; the message names the LAMBDA_* variable."""


class EmbeddedRedisError(DeployError):
    """The embedded Redis server could not be started or reached."""


class ApiError(DeployError):
    """The HTTP API could not be reached or answered with an error; the message names the URL and its detail."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class UsageError(DeployError):
    """A command-line argument that cannot be used; the message names it and shows the right form."""


class KafkaBrokerError(DeployError):
    """The embedded Kafka broker could not be set up, started or stopped; the message names what and the fix."""


class KafkaJarsError(KafkaBrokerError):
    """The broker's jars could not be resolved (Java missing, Maven repository unreachable, artifact not found)."""


class KafkaIngestBusyError(DeployError):
    """Another Kafka ingest of the pipeline runs on this data dir: one query per checkpoint."""
