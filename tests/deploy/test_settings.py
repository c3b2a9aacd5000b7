"""Settings: defaults that run on a fresh machine, and invalid values refused at start, by name."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import traceback
from pathlib import Path

import pytest

from deploy.errors import ConfigError
from deploy.setting_checks import SECRET_SETTINGS
from deploy.settings import Settings, load_settings


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
def test_a_bad_cluster_url_is_refused_at_load_naming_the_fault(tmp_path: Path, url: str, named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        load_settings(data_dir=tmp_path, redis_url=url)


# --- secrets never appear in an error -------------------------------------------------
KEY = "k" + "7Qz" * 7  # a key that passes the length rule; no word of any message contains its pieces
OTHER = "w" + "4Xv" * 7


def _pieces(secret: str, size: int = 5) -> set[str]:
    """Every piece of ``secret`` of ``size`` characters, lowercase: no part of a secret may be shown."""
    return {secret[i:i + size].lower() for i in range(len(secret) - size + 1)}


def _cli(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """`lambda-platform status` (a command that starts nothing) with ``env`` as its only LAMBDA_* variables."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("LAMBDA_")}
    environment.update(LAMBDA_ENV_FILE=os.devnull, LAMBDA_DATA_DIR=str(tmp_path / "data"), **env)
    return subprocess.run([sys.executable, "-m", "deploy.cli", "status"], env=environment, capture_output=True,
                          text=True, timeout=120, cwd=Path(__file__).resolve().parents[2])


@pytest.mark.parametrize(
    ("keys", "secrets", "says"),
    [
        ({KEY: ["read", "root"]}, [KEY], ["scope #2 of key #1 is not one of 'read', 'ingest', 'admin'"]),
        ({KEY: "admin"}, [KEY], ["the scopes of key #1 must be a JSON list"]),
        ({OTHER: ["read"], KEY: ["admin", "owner"]}, [KEY, OTHER], ["scope #2 of key #2"]),
        ({"read": [KEY]}, [KEY], ["scope #1 of key #1", "key #1 is shorter than 16 characters"]),  # swapped
        ({"": ["admin"]}, [], ["key #1 is shorter than 16 characters, the minimum for an API key"]),
        ({OTHER: ["read"], KEY[:15]: ["admin"]}, [KEY[:15], OTHER], ["key #2 is shorter than 16 characters"]),
    ],
)
def test_a_bad_api_key_setting_is_refused_naming_the_rule_never_the_key(
        tmp_path: Path, keys: dict[str, object], secrets: list[str], says: list[str]) -> None:
    done = _cli(tmp_path, LAMBDA_API_KEYS=json.dumps(keys))
    assert done.returncode == 2, done.stderr
    said = " ".join((done.stdout + done.stderr).split()).lower()
    assert "invalid settings: lambda_api_keys:" in said, said
    for words in says:
        assert words.lower() in said, said
    for secret in secrets:
        assert not _pieces(secret) & {said[i:i + 5] for i in range(len(said) - 4)}, (secret, said)


def test_api_keys_json_that_does_not_parse_is_not_quoted(tmp_path: Path) -> None:
    done = _cli(tmp_path, LAMBDA_API_KEYS=f'{{"{KEY}": ["read"]')
    assert done.returncode == 2, done.stderr
    assert "LAMBDA_API_KEYS: is not valid JSON" in done.stderr
    assert not any(piece in done.stderr.lower() for piece in _pieces(KEY)), done.stderr


def test_a_redis_password_is_masked_in_the_error(tmp_path: Path) -> None:
    done = _cli(tmp_path, LAMBDA_REDIS_URL=f"redsi://lambda:{KEY}@redis.example:6379/0")
    assert done.returncode == 2, done.stderr
    assert "'redsi://lambda:***@redis.example:6379/0'" in done.stderr
    assert not any(piece in done.stderr.lower() for piece in _pieces(KEY)), done.stderr


def test_no_part_of_a_key_reaches_the_error_or_its_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    """In process: the ConfigError, its chain as a traceback prints it, and the settings' repr."""
    monkeypatch.setenv("LAMBDA_API_KEYS", json.dumps({OTHER: ["read"], KEY: ["admin", "root"]}))
    with pytest.raises(ConfigError) as raised:
        load_settings()
    shown = "".join(traceback.format_exception(raised.value)).lower()
    assert "scope #2 of key #2" in shown
    assert not any(piece in shown for piece in _pieces(KEY) | _pieces(OTHER)), shown
    monkeypatch.setenv("LAMBDA_API_KEYS", json.dumps({KEY: ["admin"]}))
    settings = load_settings()
    assert settings.api_keys == {KEY: ["admin"]}
    assert KEY not in repr(settings) and KEY not in str(settings)


def test_every_secret_setting_is_known_as_one() -> None:
    """A SecretStr setting added later is placed by position in its errors, like the API keys."""
    secret = {name for name, field in Settings.model_fields.items() if "SecretStr" in str(field.annotation)}
    assert secret and secret | {"api_keys"} <= SECRET_SETTINGS


def test_each_pipeline_runs_on_its_own_schedule(tmp_path: Path) -> None:
    """``LAMBDA_BATCH_SCHEDULES`` gives a pipeline its own schedule; the others keep ``LAMBDA_BATCH_SCHEDULE``
    (the scheduler process runs one scheduler per pipeline on ``for_pipeline(name)``), and a name that is no
    pipeline of the deployment is refused, naming the pipelines."""
    settings = load_settings(data_dir=tmp_path, pipelines=["wordcount", "payments"], batch_schedule="1h",
                             batch_schedules={"payments": "20s"})
    assert settings.for_pipeline("payments").batch_schedule == "20s"
    assert settings.for_pipeline("wordcount").batch_schedule == "1h"
    with pytest.raises(ConfigError, match="'clicks', not a pipeline of this deployment"):
        load_settings(data_dir=tmp_path, pipelines=["wordcount", "payments"], batch_schedules={"clicks": "1m"})
