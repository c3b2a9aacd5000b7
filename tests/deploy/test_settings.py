"""Settings: defaults that run on a fresh machine, and invalid values refused at start, by name."""

from __future__ import annotations

from pathlib import Path

import pytest

from deploy.errors import ConfigError
from deploy.settings import load_settings


def test_defaults(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    for name in ("LAMBDA_DATA_DIR", "LAMBDA_REDIS_URL", "LAMBDA_PIPELINE", "LAMBDA_HTTP_PORT", "LAMBDA_HTTP_HOST"):
        monkeypatch.delenv(name, raising=False)
    settings = load_settings()
    assert settings.data_dir == Path("data")
    assert settings.redis_url is None
    assert settings.pipeline == "wordcount"
    assert (settings.http_host, settings.http_port) == ("127.0.0.1", 8000)
    assert settings.spark_master == "local[*]"


def test_environment_and_env_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    env_file = tmp_path / "lambda.env"
    env_file.write_text("LAMBDA_PIPELINE=payments\nLAMBDA_HTTP_PORT=9001\n")
    monkeypatch.setenv("LAMBDA_ENV_FILE", str(env_file))
    monkeypatch.setenv("LAMBDA_HTTP_PORT", "9002")  # the environment wins over the file
    settings = load_settings()
    assert settings.pipeline == "payments"
    assert settings.http_port == 9002


@pytest.mark.parametrize(
    ("variable", "value", "named"),
    [
        ("LAMBDA_HTTP_PORT", "70000", "LAMBDA_HTTP_PORT"),
        ("LAMBDA_HTTP_PORT", "eighty", "LAMBDA_HTTP_PORT"),
        ("LAMBDA_REDIS_URL", "http://localhost:6379", "LAMBDA_REDIS_URL"),
        ("LAMBDA_SPARK_MASTER", "banana", "LAMBDA_SPARK_MASTER"),
        ("LAMBDA_PIPELINE", "no_such_pipeline", "LAMBDA_PIPELINE"),
        ("LAMBDA_STORAGE_ENGINE", "sqlite", "LAMBDA_STORAGE_ENGINE"),
    ],
)
def test_invalid_settings_name_the_variable(monkeypatch: pytest.MonkeyPatch, variable: str, value: str, named: str) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError, match=named):
        load_settings()


@pytest.mark.parametrize(("url", "named"), [("redis+cluster://127.0.0.1", "host:port"),
                                            ("redis+cluster://127.0.0.1:7000?buckets=zero", "buckets=")])
def test_a_bad_cluster_url_is_refused_at_load_naming_the_fault(tmp_path, url: str, named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        load_settings(data_dir=tmp_path, redis_url=url)
