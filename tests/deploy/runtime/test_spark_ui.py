"""Operators can see Spark: the UI and event log settings take effect on a real session, and
``status`` shows where the batch scheduler's UI is (the speed layer's: tests/deploy/runtime/test_cluster.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import free_port
from tests.support.clusters import get_json

pytestmark = [pytest.mark.slow, pytest.mark.uses_jvm_subprocess]

ROOT = Path(__file__).resolve().parents[3]


def test_the_scheduler_serves_its_spark_ui_writes_an_event_log_and_status_shows_the_ui(
    tmp_path: Path, redis_url: str,
) -> None:
    ui_port, events = free_port(), tmp_path / "spark-events"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAMBDA_")}
    env.update({
        "PYTHONPATH": str(ROOT), "COLUMNS": "300", "LAMBDA_DATA_DIR": str(tmp_path / "data"),
        "LAMBDA_REDIS_URL": redis_url, "LAMBDA_SPARK_MASTER": "local[1]", "LAMBDA_SPARK_DRIVER_MEMORY": "1g",
        "LAMBDA_SPARK_UI": "true", "LAMBDA_SPARK_UI_PORT": str(ui_port), "LAMBDA_SPARK_EVENT_LOG_DIR": str(events),
        "LAMBDA_SPARK_CONF": json.dumps({"spark.sql.shuffle.partitions": 3, "spark.task.maxFailures": 2}),
    })
    scheduler = subprocess.Popen([sys.executable, "-m", "deploy.cli", "batch", "schedule"], env=env,
                                 start_new_session=True, stdout=(tmp_path / "scheduler.log").open("wb"),
                                 stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 600
        while True:
            status = subprocess.run([sys.executable, "-m", "deploy.cli", "status"], env=env, capture_output=True,
                                    text=True, timeout=300)
            line = next((x for x in status.stdout.splitlines() if "scheduler" in x and "Spark UI http://" in x), "")
            if line:
                break
            assert scheduler.poll() is None, (tmp_path / "scheduler.log").read_text()[-3000:]
            assert time.monotonic() < deadline, f"status never showed the scheduler's UI:\n{status.stdout}"
            time.sleep(1)
        url = line.split("Spark UI ")[1].split()[0].rstrip("│ ")
        assert url.endswith(f":{ui_port}")

        (app,) = get_json(f"http://127.0.0.1:{ui_port}/api/v1/applications")
        assert app["name"] == "lambda-scheduler-wordcount"
        properties = dict(get_json(f"http://127.0.0.1:{ui_port}/api/v1/applications/{app['id']}/environment")
                          ["sparkProperties"])
        assert properties["spark.ui.enabled"] == "true"
        assert properties["spark.ui.port"] == str(ui_port)
        assert properties["spark.eventLog.enabled"] == "true"
        assert properties["spark.eventLog.dir"] == events.resolve().as_uri()
        assert properties["spark.sql.shuffle.partitions"] == "3", "LAMBDA_SPARK_CONF goes last"
        assert properties["spark.task.maxFailures"] == "2"
        assert any(app["id"] in p.name for p in events.iterdir()), "the event log is written for the history server"

        scheduler.send_signal(signal.SIGTERM)
        assert scheduler.wait(300) == 0
    finally:
        if scheduler.poll() is None:
            os.killpg(scheduler.pid, signal.SIGKILL)
            scheduler.wait(30)
