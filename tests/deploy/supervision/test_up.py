"""`lambda-platform up` end to end, as a newcomer runs it: one command, every part supervised.

Ingest over HTTP; the merged answer reflects it within seconds; the README's Kafka section, as
written, feeds the embedded broker and its events are answered too; every acknowledged event is
counted once (oracle: tests/oracle.py over the master dataset, plus the test's own tally of what
the API acknowledged); the web console, in headless chromium, shows the running platform as the
API answers, with `up`'s first batch run through its flip; SIGTERM stops everything. (A recompute
forced over HTTP under `up`, every answer read throughout equal to the oracle at its version: the
bounded chaos test's ``recompute`` fault. `up` started again on the same data dir with every answer
exact: after SIGTERM in test_up_logic_change, after a kill -9 of its whole tree in the chaos test.)
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
from tests.support import free_port
from tests.support.browser import field, load, raw, values
from tests.support.platform import KEY, stop_up, wait_up
from tests.support.readme import bash_blocks, commands
from tests.support.speed import assert_exact, wait_caught_up

pytestmark = [pytest.mark.slow, pytest.mark.uses_platform]


_KAFKA = "Events from Kafka"


def _environment(data_dir: Path, port: int) -> dict[str, str]:
    """The platform's settings: the test's, and the README's Kafka section's (its `export` line, as written)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAMBDA_")}
    [export] = [c for c in commands(bash_blocks(_KAFKA)[0]) if c.words.startswith("export ")]
    env.update(word.split("=", 1) for word in export.words.split()[1:])
    env.update({
        "LAMBDA_DATA_DIR": str(data_dir), "LAMBDA_HTTP_PORT": str(port), "LAMBDA_PIPELINE": "wordcount",
        "LAMBDA_API_KEYS": json.dumps({KEY: ["read", "ingest", "admin"]}), "LAMBDA_BATCH_SCHEDULE": "1h",
        "LAMBDA_SPARK_MASTER": "local[2]", "LAMBDA_SPARK_SHUFFLE_PARTITIONS": "2", "LAMBDA_SPEED_TRIGGER_SECONDS": "0.5",
        "LAMBDA_KAFKA_EMBEDDED_PORT": str(free_port()),
    })
    return env


def _start(env: dict[str, str], data_dir: Path) -> subprocess.Popen[bytes]:
    log = (data_dir.parent / "up.log").open("ab")
    return subprocess.Popen([sys.executable, "-m", "deploy.cli", "up", "--no-generate"], env=env,
                            stdout=log, stderr=subprocess.STDOUT)


def _count(http: httpx.Client, word: str) -> int | None:
    response = http.get(f"/v1/views/word_counts/keys/{word}")
    return response.json()["value"]["count"] if response.status_code == 200 else None


def _first_run(http: httpx.Client) -> str:
    """The id of `up`'s own first batch run (its schedule ticks at start), once it has succeeded."""
    def succeeded() -> list[str]:
        return [r["id"] for r in http.get("/v1/batch/runs").json()["runs"] if r["status"] == "succeeded"]
    wait_up(lambda: bool(succeeded()), "up's first batch run", 240)
    return succeeded()[-1]


def _console_shows_the_platform(browser: Any, base: str, run_id: str, artifacts: Path) -> None:
    """The web console of the running platform shows the speed layer's heartbeat, the Kafka ingest's counts and
    the versions the API answers, and `up`'s first batch run with every stage through the flip."""
    load(browser, f"{base}/console", "overview")
    card = "section[data-pipeline='wordcount']"
    listing = httpx.get(f"{base}/v1/views", timeout=30).json()
    for name in ("processed_version", "latest_version", "generation"):
        want = listing["views"][0]["generation"] if name == "generation" else listing[name]
        assert field(browser, name, card) == raw(want), name
    assert "heartbeat" in browser.find_element("css selector", f"{card} [data-field='speed_state']").text
    # the Kafka section's 1,000 demo events, the file's two valid lines and its bad one (as `status` said)
    kafka = {name: field(browser, name, card) for name in ("kafka_state", "kafka_appended", "kafka_dead_lettered")}
    assert kafka == {"kafka_state": "running", "kafka_appended": "1002", "kafka_dead_lettered": "1"}, kafka
    browser.save_screenshot(str(artifacts / "up-overview.png"))
    load(browser, f"{base}/console#/pipelines/wordcount/runs", "runs")
    assert values(browser, f"li[data-run-id='{run_id}']", "data-run-status") == ["succeeded"]
    assert values(browser, f"li[data-run-id='{run_id}'] .stage", "data-stage")[-1] == "flip"
    browser.save_screenshot(str(artifacts / "up-runs.png"))


def _kafka_section_as_written(folder: Path, env: dict[str, str], http: httpx.Client) -> None:
    """The README's Kafka commands after its `up`, run as written from a folder holding the project's `.venv`
    (a file of two events and a bad line for `kafka feed events.jsonl`): the demo's and the file's valid events
    reach the merged answer through the embedded broker, the bad line becomes a dead letter, `status` says so."""
    folder.mkdir()
    (folder / ".venv").symlink_to(Path(sys.prefix))
    (folder / "events.jsonl").write_text('{"text": "gnu kafkaword"}\nnot json\n{"text": "gnu"}\n')
    runs = [c for c in commands(bash_blocks(_KAFKA)[0]) if not c.words.startswith("export ") and " up" not in c.words]
    feeds, [status] = runs[:-1], runs[-1:]
    assert [c.words.split()[1:3] for c in feeds] == [["kafka", "feed"]] * 2
    for command in feeds:
        done = subprocess.run(["bash", "-c", command.text], cwd=folder, env=env, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0 and "produced" in done.stderr and "WARN" not in done.stderr, done.stderr
    wait_up(lambda: _count(http, "gnu") == 2 and _count(http, "kafkaword") == 1, "the Kafka events' answers", 240)
    said = " ".join(subprocess.run(["bash", "-c", status.text], cwd=folder, env=env, capture_output=True, text=True,
                                   timeout=120).stdout.split())
    assert "kafka ingest" in said and "appended 1,002, dead letters 1, lag 0 records" in said, said


def test_up_with_kafka_ingest_console_and_stop(tmp_path: Path, browser: Any, artifacts: Path) -> None:
    data_dir, port = tmp_path / "data", free_port()
    base = f"http://127.0.0.1:{port}"
    auth = {"Authorization": f"Bearer {KEY}"}
    settings = load_settings(data_dir=data_dir, pipeline="wordcount", http_port=port,
                             redis_url=f"unix://{data_dir.resolve() / 'redis' / 'redis.sock'}")
    env = _environment(data_dir, port)
    process = _start(env, data_dir)
    try:
        with httpx.Client(base_url=base, headers=auth, timeout=30) as http:
            wait_up(lambda: http.get("/readyz").status_code == 200, "the platform to be ready")
            for text in ("zebra quagga", "zebra", "okapi zebra"):
                response = http.post("/v1/events", json={"text": text})
                assert response.status_code == 202, response.text
            wait_up(lambda: _count(http, "zebra") == 3, "the merged answer to reflect the ingest", 180)

            run_id = _first_run(http)
            _kafka_section_as_written(tmp_path / "newcomer", env, http)
        version = wait_caught_up(settings)
        assert assert_exact(base, settings, version) > 20
        _console_shows_the_platform(browser, base, run_id, artifacts)
        stop_up(process, port)
    finally:
        if process.poll() is None:
            stop_up(process, port)

