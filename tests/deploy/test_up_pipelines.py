"""Two pipelines in one `up` (``LAMBDA_PIPELINES=wordcount,payments``), each exact, each on its own schedule.

One API, one speed-layer process (a streaming query per pipeline in one Spark application), one
scheduler process (a scheduler per pipeline). Events posted to each pipeline's routes reach its
merged answers through its speed layer; every key of every view of each pipeline then equals
the oracle over that pipeline's master dataset; payments' schedule (every 20 s) ticks on by
itself while wordcount's (an hour) ticks only at start; `status` reads both as serving.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from deploy.settings import load_settings
from tests.deploy.test_up import KEY, _stop, _wait
from tests.support import free_port
from tests.support.speed import assert_exact, wait_caught_up

pytestmark = [pytest.mark.slow, pytest.mark.uses_platform]

PAYMENTS = [{"user_id": u, "merchant": m, "amount": a, "event_time": "2024-03-01T10:00:00Z"}
            for u, m, a in (("zed", "acme", 2.5), ("zed", "hooli", 4.0), ("yan", "acme", 1.25))]


def _env(data_dir: Path, port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAMBDA_")}
    env.update({
        "LAMBDA_DATA_DIR": str(data_dir), "LAMBDA_HTTP_PORT": str(port), "LAMBDA_PIPELINES": "wordcount,payments",
        "LAMBDA_API_KEYS": json.dumps({KEY: ["read", "ingest", "admin"]}), "LAMBDA_BATCH_SCHEDULE": "1h",
        "LAMBDA_BATCH_SCHEDULES": json.dumps({"payments": "20s"}), "LAMBDA_SPARK_MASTER": "local[2]",
        "LAMBDA_SPEED_TRIGGER_SECONDS": "0.5", "LAMBDA_ENV_FILE": os.devnull,
    })
    return env


def _scheduled(http: httpx.Client, routes: str) -> list[dict]:
    return [run for run in http.get(f"{routes}/batch/runs").json()["runs"] if run["trigger"] == "schedule"]


def test_two_pipelines_in_one_up(tmp_path: Path) -> None:
    data_dir, port = tmp_path / "data", free_port()
    env = _env(data_dir, port)
    process = subprocess.Popen([sys.executable, "-m", "deploy.cli", "up", "--no-generate"], env=env,
                               stdout=(tmp_path / "up.log").open("ab"), stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    redis_url = f"unix://{data_dir.resolve() / 'redis' / 'redis.sock'}"
    settings = load_settings(data_dir=data_dir, pipelines=["wordcount", "payments"], redis_url=redis_url)
    try:
        with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {KEY}"}, timeout=30) as http:
            for routes in ("/v1", "/v1/pipelines/payments"):
                _wait(lambda routes=routes: http.get(f"{routes}/views").json().get("views", [{}])[0].get("generation")
                      is not None, f"{routes}: a served generation", 600)
            listed = http.get("/v1/pipelines").json()["pipelines"]
            assert [p["name"] for p in listed] == ["wordcount", "payments"], listed

            assert http.post("/v1/events", json={"text": "zebra okapi zebra"}).status_code == 202
            posted = http.post("/v1/pipelines/payments/events", json=PAYMENTS)
            assert posted.status_code == 202, posted.text
            unknown = http.post("/v1/pipelines/clicks/events", json=PAYMENTS)
            assert unknown.status_code == 404 and "'payments'" in unknown.json()["detail"], unknown.text

            for name, routes in (("wordcount", "/v1"), ("payments", "/v1/pipelines/payments")):
                own = settings.for_pipeline(name)
                version = wait_caught_up(own, 300)
                assert assert_exact(base, own, version, routes=routes) > 3, name

            # An interval schedule ticks at start, then every interval: payments' ticks go on, wordcount's
            # next one is an hour away.
            _wait(lambda: len(_scheduled(http, "/v1/pipelines/payments")) >= 3, "payments' own schedule", 300)
            assert len(_scheduled(http, "/v1")) == 1, _scheduled(http, "/v1")

        status = subprocess.run([sys.executable, "-m", "deploy.cli", "status", "--json"], env=env,
                                capture_output=True, text=True, timeout=180)
        report = json.loads(status.stdout)
        assert [p["pipeline"] for p in report["pipelines"]] == ["wordcount", "payments"], report
        assert status.returncode == 0 and all(p["serving"] for p in report["pipelines"]), status.stdout
        _stop(process, port)
    finally:
        if process.poll() is None:
            _stop(process, port)
