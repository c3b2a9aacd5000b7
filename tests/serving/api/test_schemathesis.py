"""Schemathesis, every check, against a live server with published data and API keys.

The API is served as ``create_app`` builds it (real uvicorn, real Redis, a real batch generation
of the payments pipeline, real Delta master dataset), with API keys configured. Schemathesis
(``schemathesis run``, in a subprocess) reads ``/openapi.json`` and runs all its checks: no 5xx,
status codes, content types, headers and bodies as documented, valid data accepted and invalid
data rejected, undeclared methods answered 405 with ``Allow``, and auth: it sends requests
without the key and with a wrong one and expects 401/403 where the document declares security.

Two runs, bounded in examples (not in time):

* **Keys needed everywhere** (the policy of a server bound to a non-loopback address), sending a
  key with every scope: every check. Documented exceptions (``CONFIG``): a 422 for schema-valid
  requests is accepted where the server keeps a rule the document cannot state.
* **Loopback** (reads open, the documented choice), sending no key: the document itself marks the
  security of reads optional (``security: [{APIKey: []}, {}]``), so ``ignored_auth`` holds there
  too, and writes answer 401.

A third run fuzzes the view routes of a pipeline with a sliding and a session view
(``tests.support.windows_pipeline``): window and range parameters, relative times, session reads.

NDJSON bodies are sent by a hook (``tests.serving.api.schemathesis_hooks``). Findings fixed on the way:
positive data refused for an Idempotency-Key the document allowed (now its length and characters
are in the document, and a malformed header is a 400), NDJSON bodies that could not be generated
(now documented by their events), view names and measures that were plain strings (now ``enum``).
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from batch_layer.recompute.job import run_batch
from deploy.settings import Settings
from shared_logic.registry import load_pipeline
from tests import oracle
from tests.support import ingest_file

KEY = "schemathesis-all-scopes-5d1e"
START = datetime(2024, 3, 1, 9, 0, tzinfo=timezone.utc)


#: Where the document cannot state a rule the server keeps, a 422 for a schema-valid request is the
#: right answer. Only these operations, and only that status, are exempt from positive_data_acceptance:
#: * the views: rules between parameters and the view (window_start or from/to only for windowed views,
#:   one or the other, 'to' after 'from', windows inside the supported time range); OpenAPI 3.1
#:   parameters cannot relate to each other or to the value of a path parameter;
#: * ingest: an Idempotency-Key reused with another body is 422, as the IETF Idempotency-Key draft
#:   says; the document cannot know which keys were used before.
#: * readiness: /readyz answers 503 by design while a part has not done its job or is failing (here: no
#:   speed layer runs while generated ingests add versions), so a 5xx there is no server error.
CONFIG = """
[[operations]]
include-path = "/readyz"
checks.not_a_server_error.enabled = false

[[operations]]
include-path-regex = "^/v1/views/[{]view[}]/"
checks.positive_data_acceptance.expected-statuses = ["2xx", "3xx", "401", "403", "404", "409", "422", "429", "5xx"]

[[operations]]
include-path = "/v1/events"
include-method = "POST"
checks.positive_data_acceptance.expected-statuses = ["2xx", "3xx", "401", "403", "404", "409", "422", "429", "5xx"]
"""
ROOT = Path(__file__).resolve().parents[3]


def schemathesis(base_url: str, tmp_path: Path, *args: str, checks: str = "all") -> subprocess.CompletedProcess[str]:
    """``schemathesis run`` with every check, bounded examples, a fixed seed, and the NDJSON hook."""
    config = tmp_path / "schemathesis.toml"
    config.write_text(CONFIG, encoding="utf-8")
    command = [
        sys.executable, "-m", "schemathesis.cli", "--config-file", str(config), "run", f"{base_url}/openapi.json",
        # every check comes from the config unless named: CLI options would override its per-operation settings
        *(("--checks", checks) if checks != "all" else ()), "--max-examples", "12", "--seed", "20261123", "--workers", "1",
        "--request-timeout", "30", "--suppress-health-check", "all", *args,
    ]
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "tests.serving.api.schemathesis_hooks",
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    return subprocess.run(command, capture_output=True, text=True, timeout=540, cwd=tmp_path, env=env)


def published(spark: Any, make_settings: Callable[..., Settings], tmp_path: Path) -> Settings:
    settings = make_settings(pipeline="payments")
    ingest_file(settings, oracle.payments_events(random.Random(3), 80, START, seconds=6 * 3600), tmp_path / "p.jsonl")
    run_batch(spark, settings, load_pipeline("payments"), redis_url=settings.redis_url)
    return settings


@pytest.mark.slow
def test_schemathesis_all_checks_against_a_live_server(spark: Any, make_settings: Callable[..., Settings],
                                                        api: Callable[..., Any], tmp_path: Path) -> None:
    published(spark, make_settings, tmp_path)
    keys = {KEY: ["read", "ingest", "admin"]}
    with api(pipeline="payments", api_keys=keys, http_host="0.0.0.0") as server:
        run = schemathesis(server.base_url, tmp_path, "--header", f"Authorization: Bearer {KEY}")
    assert run.returncode == 0, f"schemathesis (keys needed everywhere) found problems:\n{run.stdout[-12000:]}"
    with api(pipeline="payments", api_keys=keys, http_host="127.0.0.1") as server:
        run = schemathesis(server.base_url, tmp_path, "--exclude-path", "/readyz",  # its 503 is by design (above)
                           checks="ignored_auth,not_a_server_error,status_code_conformance")
    assert run.returncode == 0, f"schemathesis (loopback, no key sent) found problems:\n{run.stdout[-12000:]}"


WINDOWS = "tests.support.windows_pipeline"


@pytest.mark.slow
def test_schemathesis_on_sliding_and_session_views(spark: Any, make_settings: Callable[..., Settings],
                                                   api: Callable[..., Any], tmp_path: Path) -> None:
    settings = make_settings(pipeline=WINDOWS)
    rng = random.Random(11)
    start = int(START.timestamp())
    plays = [{"song": f"song-{rng.randrange(6)}", "listener": f"user-{rng.randrange(5)}",
              "seconds": rng.randint(1, 300), "event_time": str(start + rng.randrange(6 * 3600))} for _ in range(120)]
    ingest_file(settings, plays, tmp_path / "plays.jsonl")
    run_batch(spark, settings, load_pipeline(WINDOWS), redis_url=settings.redis_url)
    with api(pipeline=WINDOWS) as server:
        run = schemathesis(server.base_url, tmp_path, "--include-path-regex", "^/v1/views",
                           checks="not_a_server_error,status_code_conformance,content_type_conformance,"
                                  "response_schema_conformance")
    assert run.returncode == 0, f"schemathesis (sliding and session views) found problems:\n{run.stdout[-12000:]}"
