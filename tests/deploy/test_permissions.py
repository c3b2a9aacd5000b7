"""The data dir is private from the start: folders 0700, the local API key and Redis's files 0600.

Every test runs with the common umask 022, under which a plain ``mkdir`` makes 0755 and a plain
``open`` 0644 (world-readable events and keys): the modes checked here must come from the code.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from deploy.data_dir import local_api_key, with_api_keys
from deploy.runtime.redis_server import embedded_redis_url, ensure_embedded_redis, stop_embedded_redis
from deploy.settings import load_settings
from deploy.supervision.supervisor import Child


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture(autouse=True)
def common_umask() -> Iterator[None]:
    previous = os.umask(0o022)
    yield
    os.umask(previous)


def test_embedded_redis_keeps_its_files_private(tmp_path: Path) -> None:
    data_dir = tmp_path / "fresh" / "data"
    redis_dir = data_dir / "redis"
    url = ensure_embedded_redis(redis_dir)
    try:
        client = redis.Redis.from_url(url)
        client.set("an-event", "private")
        client.close()
        assert url == embedded_redis_url(redis_dir)
        assert mode(data_dir) == 0o700 and mode(redis_dir) == 0o700
        aof = [p for p in redis_dir.rglob("*") if "appendonly" in p.name and p.is_file()]
        assert aof, f"no append-only file in {sorted(redis_dir.iterdir())}"
        for path in [*aof, redis_dir / "redis.log", redis_dir / "redis.pid"]:
            assert mode(path) == 0o600, f"{path.name} is {oct(mode(path))}"
    finally:
        stop_embedded_redis(redis_dir)


def test_local_api_key_is_0600_without_a_chmod(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Written with its mode from the start: there is no moment at which another user can read it."""
    chmods: list[object] = []
    monkeypatch.setattr(Path, "chmod", lambda self, *a, **k: chmods.append(self))
    monkeypatch.setattr(os, "chmod", lambda *a, **k: chmods.append(a))
    monkeypatch.delenv("LAMBDA_API_KEYS", raising=False)
    settings = load_settings(data_dir=tmp_path / "data", redis_url="redis://127.0.0.1:1")
    key = local_api_key(settings)
    path = settings.local_api_key_path
    assert key and path.read_text() == key
    assert mode(path) == 0o600 and mode(path.parent) == 0o700 and not chmods
    assert local_api_key(settings) == key, "a second command must find the same key"
    with_keys, local = with_api_keys(settings)
    assert local == key and with_keys.api_keys == {key: ["read", "ingest", "admin"]}
    assert [p.name for p in path.parent.iterdir()] == ["local_api_key"], "no temporary file is left behind"


def test_the_command_line_makes_the_data_dir_private(tmp_path: Path) -> None:
    (tmp_path / "events.jsonl").write_text('{"text": "private words"}\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAMBDA_")}
    env["LAMBDA_DATA_DIR"] = str(tmp_path / "data")
    done = subprocess.run([sys.executable, "-m", "deploy.cli", "ingest", str(tmp_path / "events.jsonl")], env=env,
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert mode(tmp_path / "data") == 0o700


def test_supervised_children_write_private_logs_and_can_run_with_a_umask(tmp_path: Path) -> None:
    made = tmp_path / "made-by-child"
    child = Child("touch", [sys.executable, "-c", f"open({str(made)!r}, 'w').write('x')"], dict(os.environ),
                  tmp_path / "logs" / "touch.log", umask=0o077)
    child.start()
    assert child.process is not None and child.process.wait(30) == 0
    child.stop(5)
    assert mode(made) == 0o600
    assert mode(tmp_path / "logs") == 0o700 and mode(tmp_path / "logs" / "touch.log") == 0o600
