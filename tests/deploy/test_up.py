"""`lambda-platform up` end to end, as a newcomer runs it: one command, every part supervised.

Ingest over HTTP; the merged answer reflects it within seconds; a recompute triggered over HTTP
leaves every answer unchanged across the generation flip; SIGTERM stops everything; `up` again on
the same data dir: every acknowledged event is still counted once (oracle: tests/oracle.py over
the master dataset, plus the test's own tally of what the API acknowledged); the web console, in
headless chromium, shows the running platform as the API answers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from deploy.settings import load_settings
from tests.support import CLICKS_PIPELINE, free_port
from tests.support.browser import field, load, raw, values
from tests.support.platform import KEY, stop_up, wait_up
from tests.support.speed import assert_exact, wait_caught_up

pytestmark = [pytest.mark.slow, pytest.mark.uses_platform]


def _start(data_dir: Path, port: int) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAMBDA_")}
    env.update({
        "LAMBDA_DATA_DIR": str(data_dir), "LAMBDA_HTTP_PORT": str(port), "LAMBDA_PIPELINE": "wordcount",
        "LAMBDA_API_KEYS": json.dumps({KEY: ["read", "ingest", "admin"]}), "LAMBDA_BATCH_SCHEDULE": "1h",
        "LAMBDA_SPARK_MASTER": "local[2]", "LAMBDA_SPEED_TRIGGER_SECONDS": "0.5",
    })
    log = (data_dir.parent / "up.log").open("ab")
    return subprocess.Popen([sys.executable, "-m", "deploy.cli", "up", "--no-generate"], env=env,
                            stdout=log, stderr=subprocess.STDOUT)


def _count(http: httpx.Client, word: str) -> int | None:
    response = http.get(f"/v1/views/word_counts/keys/{word}")
    return response.json()["value"]["count"] if response.status_code == 200 else None


def _trigger_recompute(http: httpx.Client) -> str:
    """POST a forced run (recompute even if nothing changed); while `up`'s own first run is still
    in flight the answer is 409 naming it (one run at a time), so wait for that one and ask again."""
    for _ in range(3):
        run = http.post("/v1/batch/runs", json={"force": True})
        if run.status_code == 202:
            return run.json()["id"]
        assert run.status_code == 409, run.text
        busy = run.headers["Location"]
        wait_up(lambda busy=busy: http.get(busy).json()["status"] not in ("queued", "running"),
                f"run {busy}, which holds the single-flight slot", 240)
    raise AssertionError(f"no recompute admitted after 3 tries; last answer: {run.text}")


def _console_shows_the_platform(browser: Any, base: str, run_id: str, artifacts: Path) -> None:
    """The web console of the running platform shows the speed layer's heartbeat and the versions
    the API answers, and the recompute triggered over HTTP with every stage through the flip."""
    load(browser, f"{base}/console", "overview")
    card = "section[data-pipeline='wordcount']"
    listing = httpx.get(f"{base}/v1/views", timeout=30).json()
    for name in ("processed_version", "latest_version", "generation"):
        want = listing["views"][0]["generation"] if name == "generation" else listing[name]
        assert field(browser, name, card) == raw(want), name
    assert "heartbeat" in browser.find_element("css selector", f"{card} [data-field='speed_state']").text
    browser.save_screenshot(str(artifacts / "up-overview.png"))
    load(browser, f"{base}/console#/pipelines/wordcount/runs", "runs")
    assert values(browser, f"li[data-run-id='{run_id}']", "data-run-status") == ["succeeded"]
    assert values(browser, f"li[data-run-id='{run_id}'] .stage", "data-stage")[-1] == "flip"
    browser.save_screenshot(str(artifacts / "up-runs.png"))


def test_up_ingest_recompute_restart(tmp_path: Path, browser: Any, artifacts: Path) -> None:
    data_dir, port = tmp_path / "data", free_port()
    base = f"http://127.0.0.1:{port}"
    auth = {"Authorization": f"Bearer {KEY}"}
    settings = load_settings(data_dir=data_dir, pipeline="wordcount", http_port=port,
                             redis_url=f"unix://{data_dir.resolve() / 'redis' / 'redis.sock'}")
    process = _start(data_dir, port)
    try:
        with httpx.Client(base_url=base, headers=auth, timeout=30) as http:
            wait_up(lambda: http.get("/readyz").status_code == 200, "the platform to be ready")
            acknowledged = 0
            for text in ("zebra quagga", "zebra", "okapi zebra"):
                response = http.post("/v1/events", json={"text": text})
                assert response.status_code == 202, response.text
                acknowledged += 1
            wait_up(lambda: _count(http, "zebra") == 3, "the merged answer to reflect the ingest", 180)

            before = {w: _count(http, w) for w in ("zebra", "quagga", "okapi", "the")}
            run_id = _trigger_recompute(http)
            wait_up(lambda: http.get(f"/v1/batch/runs/{run_id}").json()["status"] in ("succeeded", "failed", "skipped"),
                    "the triggered recompute", 240)
            assert http.get(f"/v1/batch/runs/{run_id}").json()["status"] == "succeeded"
            assert {w: _count(http, w) for w in before} == before, "answers changed across the generation flip"
        stop_up(process, port)

        process = _start(data_dir, port)
        with httpx.Client(base_url=base, headers=auth, timeout=30) as http:
            wait_up(lambda: http.get("/readyz").status_code == 200, "the platform to be ready again")
            assert _count(http, "zebra") == 3 and acknowledged == 3
        version = wait_caught_up(settings)
        assert assert_exact(base, settings, version) > 20
        _console_shows_the_platform(browser, base, run_id, artifacts)
    finally:
        if process.poll() is None:
            stop_up(process, port)


def test_up_with_own_pipeline_on_a_fresh_data_dir(tmp_path: Path) -> None:
    """No sample events, no API keys set, the module in the current folder, the installed command:
    `up` keeps running and answers 503 "nothing published yet"; the first events are published
    within seconds (the schedule is an hour); answers then equal the oracle (sums of the events
    posted); `status` reads every part as up with `up`'s local key, and exits 0."""
    from tests.deploy.test_cli_messages import installed_command

    folder, port = tmp_path / "mine", free_port()
    folder.mkdir()
    (folder / "clicks.py").write_text(CLICKS_PIPELINE)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAMBDA_")}
    env.update({"LAMBDA_PIPELINE": "clicks", "LAMBDA_HTTP_PORT": str(port), "LAMBDA_BATCH_SCHEDULE": "1h",
                "LAMBDA_SPARK_MASTER": "local[2]", "LAMBDA_SPEED_TRIGGER_SECONDS": "0.5"})
    base = f"http://127.0.0.1:{port}"
    log = (tmp_path / "up.log").open("ab")
    process = subprocess.Popen([*installed_command(), "up", "--no-generate"], cwd=folder, env=env, stdout=log,
                               stderr=subprocess.STDOUT)
    try:
        with httpx.Client(base_url=base, timeout=30) as http:
            wait_up(lambda: http.get("/healthz").status_code == 200 or process.poll() is not None, "the API")
            assert process.poll() is None, (tmp_path / "up.log").read_text()
            ready = http.get("/readyz")
            assert ready.status_code == 503 and "no batch generation is published" in ready.text, ready.text
            key = (folder / "data" / "local_api_key").read_text().strip()
            events = [{"page": f"/{s}/p{i}", "ms_on_page": 7 * i} for i, s in enumerate(["news", "sport", "news"] * 4)]
            posted = http.post("/v1/events", json=events, headers={"Authorization": f"Bearer {key}"})
            assert posted.status_code == 202, posted.text
            want = {}
            for e in events:
                section = e["page"].split("/")[1]
                count, total = want.get(section, (0, 0))
                want[section] = (count + 1, total + e["ms_on_page"])

            def answers() -> dict[str, tuple[int, int]]:
                got = {}
                for section in want:
                    response = http.get(f"/v1/views/page_views/keys/{section}")
                    if response.status_code != 200:
                        return {}
                    value = response.json()["value"]
                    got[section] = (value["count"], value["sum_ms_on_page"])
                return got

            wait_up(lambda: http.get("/readyz").status_code == 200, "the first generation", 900)
            wait_up(lambda: answers() == want, "answers equal to the events posted", 300)
            wait_up(lambda: http.get("/readyz").status_code == 200 and "speed layer up" in http.get("/readyz").text,
                    "the speed layer's heartbeat", 300)
        status = subprocess.run([*installed_command(), "status", "--json"], cwd=folder, env=env, capture_output=True,
                                text=True, timeout=120)
        assert status.returncode == 0, status.stdout + status.stderr
        report = json.loads(status.stdout)
        assert report["serving"] and report["pipeline"] == "clicks"
        assert {p["part"]: p["state"] for p in report["parts"]} == {
            "master dataset": "up", "redis": "up", "batch layer": "up", "speed layer": "up", "api": "up",
            "scheduler": "up", "last batch run": "up"}, report
        stop_up(process, port)
    finally:
        if process.poll() is None:
            stop_up(process, port)
