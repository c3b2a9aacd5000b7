"""`lambda-platform up` as a newcomer runs it, then under one fault of each kind with live traffic (slow tier).

One `up --no-generate` of wordcount, with the README's Kafka section's settings as written, proves:

1. What a newcomer sees: events posted over HTTP are answered within seconds; the README's Kafka
   commands, run as written, feed the embedded broker and their events are answered too (a bad line
   becomes a dead letter, `status` says so); the web console, in headless chromium, shows the
   running platform as the API answers it and `up`'s first batch run through its flip.
2. Bounded chaos: every kind of fault happens once, in a seeded order (kill -9 of the speed layer,
   the API, the scheduler, Redis and the whole `up` tree, the broker and the Kafka ingest with it;
   a forced recompute); nothing acknowledged is lost and nothing is counted twice. The oracle is
   independent of the platform: the writers' own record of what was acknowledged, the master's
   Delta log and table read with delta-rs (tests/chaos/audit.py), and plain Python views
   (tests/oracle.py) over every served row. Faults drawn at random after those are the
   benchmark's (benchmarks/chaos.py: >= 50 faults with a summary table).
3. SIGTERM stops everything: `up` exits 0 and nothing listens on its port any more.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from deploy.settings import load_settings
from tests.chaos.faults import FAULT_KINDS, FaultPlan
from tests.chaos.harness import ChaosConfig, run_chaos
from tests.chaos.platform_tree import UpTree
from tests.support import free_port, web
from tests.support.browser import field, load, raw, values
from tests.support.platform import wait_up
from tests.support.readme import bash_blocks, commands
from tests.support.speed import assert_exact, wait_caught_up

pytestmark = [pytest.mark.slow, pytest.mark.uses_platform, pytest.mark.uses_kafka, pytest.mark.chaos]

_KAFKA = "Events from Kafka"


def _up_settings() -> dict[str, str]:
    """The README's Kafka section's `export` line, as written, and a free port for its embedded broker; small
    speed-layer write chunks (3 rows), so a micro-batch takes many write calls and readers land between them."""
    [export] = [c for c in commands(bash_blocks(_KAFKA)[0]) if c.words.startswith("export ")]
    settings = dict(word.split("=", 1) for word in export.words.split()[1:])
    return {**settings, "LAMBDA_KAFKA_EMBEDDED_PORT": str(free_port()), "LAMBDA_SPEED_CHUNK_ROWS": "3"}


def _every_answer_exact(tree: UpTree) -> None:
    """Once the speed layer has caught up: every key of every view (the sample events, the HTTP and the Kafka
    ones, on both sides of the first run's barrier) equals the oracle at the version named."""
    data_dir = tree.config.data_dir
    settings = load_settings(data_dir=data_dir, pipeline="wordcount", http_port=tree.config.port,
                             redis_url=f"unix://{data_dir.resolve() / 'redis' / 'redis.sock'}")
    version = wait_caught_up(settings)
    assert assert_exact(tree.base_url, settings, version) > 20


def _count(http: httpx.Client, word: str) -> int | None:
    response = http.get(f"/v1/views/word_counts/keys/{word}")
    return response.json()["value"]["count"] if response.status_code == 200 else None


def _http_ingest_is_answered(http: httpx.Client) -> None:
    for text in ("zebra quagga", "zebra", "okapi zebra"):
        response = http.post("/v1/events", json={"text": text})
        assert response.status_code == 202, response.text
    wait_up(lambda: _count(http, "zebra") == 3, "the merged answer to reflect the ingest", 180)


def _first_run(http: httpx.Client) -> str:
    """The id of `up`'s own first batch run (its schedule ticks at start), once it has succeeded."""
    def succeeded() -> list[str]:
        return [r["id"] for r in http.get("/v1/batch/runs").json()["runs"] if r["status"] == "succeeded"]
    wait_up(lambda: bool(succeeded()), "up's first batch run", 240)
    return succeeded()[-1]


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


def _console_shows_the_platform(browser: Any, http: httpx.Client, base: str, run_id: str, artifacts: Path) -> None:
    """The web console shows the speed layer's heartbeat, the Kafka ingest's counts and the versions the API
    answers (once the speed layer has caught up with the master), and `up`'s first batch run through its flip."""
    def caught_up() -> dict[str, Any] | None:
        listing: dict[str, Any] = http.get("/v1/views").json()
        return listing if listing["processed_version"] == listing["latest_version"] else None
    wait_up(caught_up, "the speed layer to catch up with the master", 120)
    listing = caught_up()
    assert listing is not None
    load(browser, f"{base}/console", "overview")
    card = "section[data-pipeline='wordcount']"
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


def test_up_as_a_newcomer_runs_it_then_loses_nothing_under_every_kind_of_fault(
        tmp_path: Path, browser: Any, artifacts: Path) -> None:
    trees: list[UpTree] = []

    def newcomer(http: httpx.Client, tree: UpTree) -> None:
        trees.append(tree)
        _http_ingest_is_answered(http)
        run_id = _first_run(http)
        _kafka_section_as_written(tmp_path / "newcomer", tree.env(), http)
        _every_answer_exact(tree)
        _console_shows_the_platform(browser, http, tree.base_url, run_id, artifacts)

    plan = FaultPlan(max_faults=len(FAULT_KINDS), min_gap=2.0, max_gap=4.0, wait_fresh=False, seed=7)
    config = ChaosConfig(work_dir=tmp_path, plan=plan, rate=15.0, max_batch=30, up_env=_up_settings(),
                         before_traffic=newcomer)
    result = run_chaos(config, progress=print)
    print(result.table())

    assert trees, "the newcomer's steps ran"
    assert set(result.faults) == set(FAULT_KINDS), f"every kind of fault happens: {dict(result.faults)}"
    assert result.fault_total == len(FAULT_KINDS)
    assert result.acknowledged_events > 0 and result.findings.counters["answers checked"] > 0
    assert result.rows_compared > 0 and result.keys_in_log >= result.acknowledged_requests
    assert not result.findings.violations, result.table()
    assert result.stop_seconds is not None and result.up_exit_code == 0, f"up exited {result.up_exit_code} on SIGTERM"
    assert not result.left_running, f"up exited and left these running: {result.left_running}"
    with pytest.raises(httpx.TransportError):
        web.get(f"{trees[0].base_url}/healthz", timeout=2)
