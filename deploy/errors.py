"""Errors of the deploy package (configuration, launching processes)."""


class DeployError(Exception):
    """Root of every error raised by the deploy package."""


class ConfigError(DeployError):
    """A setting is missing or invalid; the message names the LAMBDA_* variable."""


class EmbeddedRedisError(DeployError):
    """The embedded Redis server could not be started or reached."""
