"""Without LAMBDA_API_KEYS every command uses the data dir's local key, the one `up` makes.

`serve` started alone accepts it (ingest, admin), `generate` sends it, and `status` reads with it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from deploy.data_dir import local_api_key
from deploy.settings import load_settings
from tests.support import free_port, web

pytestmark = pytest.mark.slow


def _wait_healthy(base: str, process: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 90
    while True:
        assert process.poll() is None, process.communicate()[1]
        try:
            if web.get(f"{base}/healthz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "serve did not come up"
        time.sleep(0.2)


def test_serve_and_generate_use_the_local_key_up_made(tmp_path: Path, redis_url: str) -> None:
    data_dir, port = tmp_path / "data", free_port()
    key = local_api_key(load_settings(data_dir=data_dir, redis_url=redis_url))  # as `up` makes it
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAMBDA_")}
    env.update({"LAMBDA_DATA_DIR": str(data_dir), "LAMBDA_REDIS_URL": redis_url, "LAMBDA_HTTP_PORT": str(port)})
    base = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "deploy.cli", "serve"], env=env, cwd=tmp_path,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_healthy(base, server)
        auth = {"Authorization": f"Bearer {key}"}
        accepted = web.post(f"{base}/v1/events", json=[{"text": "a local key"}], headers=auth, timeout=30)
        assert accepted.status_code == 202, accepted.text
        assert web.post(f"{base}/v1/events", json=[{"text": "x"}], headers={"Authorization": "Bearer nope"},
                          timeout=30).status_code == 401
        assert web.get(f"{base}/v1/batch/runs", headers=auth, timeout=30).status_code == 200

        generator = subprocess.Popen([sys.executable, "-m", "deploy.cli", "generate", "--rate", "50"], env=env,
                                     cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert generator.stderr is not None
        started = generator.stderr.readline()  # "posting wordcount events at 50/s to ...": it is running
        assert "posting" in started, started + generator.communicate(timeout=60)[1]
        time.sleep(3)
        generator.send_signal(signal.SIGINT)
        _, said = generator.communicate(timeout=60)
        assert generator.returncode == 0, said
        assert "answered 401" not in said and "answered 403" not in said, said
        assert int(said.split(" events accepted")[0].split()[-1]) > 0, said
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(30)
