"""Two pipelines behind one API (``LAMBDA_PIPELINES``), against the oracle of each.

wordcount (the default) and payments are ingested and recomputed each on its own master
dataset; one API serves both. Every oracle row of each pipeline is asked for under
``/v1/pipelines/{pipeline}/...`` (and wordcount's also un-prefixed) and must equal that
pipeline's oracle; events posted under one pipeline's prefix land in its master dataset only; a
batch run queued under a prefix is that pipeline's (its ``Location`` leads back under the prefix);
an unknown pipeline answers 404 naming the known ones.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

import httpx
import pytest

from deploy.settings import Settings
from tests import oracle
from tests.support import key_url, web
from tests.support.published import Published, publish, value_problems
from tests.support.servers import ApiServer

KEY = "test-admin-key-0001"
START = datetime(2024, 3, 1, 9, 0, tzinfo=timezone.utc)


@pytest.fixture(scope="module")
def two(spark: Any, module_settings: Callable[..., Settings], tmp_path_factory: pytest.TempPathFactory,
        module_redis_url: str) -> tuple[Settings, dict[str, Published]]:
    """Both pipelines ingested and recomputed once for the module (the last test adds an event and a queued run,
    which the others, run before it, never see: nothing recomputes)."""
    settings = module_settings(pipelines=["wordcount", "payments"], api_keys={KEY: ["read", "ingest", "admin"]})
    rng = random.Random(11)
    events = {"wordcount": oracle.wordcount_events(rng, 40, START), "payments": oracle.payments_events(rng, 60, START)}
    folder = tmp_path_factory.mktemp("events")
    published = {name: publish(spark, settings.for_pipeline(name), events[name], folder, module_redis_url)
                 for name in settings.pipeline_names}
    return settings, published


def _client(server: ApiServer) -> httpx.Client:
    return web.client(base_url=server.base_url, timeout=30, headers={"Authorization": f"Bearer {KEY}"})


def _problems(http: httpx.Client, prefix: str, published: Published) -> list[str]:
    problems: list[str] = []
    for view, rows in published.views.items():
        size = oracle.VIEW_WINDOWS[view]
        for (key, start), want in rows.items():
            params = {} if start is None or size is None else {"window_start": str(start)}
            response = http.get(prefix + key_url(view, key).removeprefix("/v1"), params=params)
            if response.status_code != 200:
                problems.append(f"{prefix} {view} {key!r}: HTTP {response.status_code} {response.text}")
                continue
            problems += value_problems(f"{prefix} {view} {key!r} {params}", response.json()["value"], want)
    return problems


@pytest.mark.slow  # over 10 s: the end-to-end tier
def test_each_pipeline_answers_its_own_oracle(two: tuple[Settings, dict[str, Published]], module_redis_url: str) -> None:
    from serving.api.app import create_app

    settings, published = two
    with ApiServer(create_app(settings, redis_url=module_redis_url)) as server, \
            _client(server) as http:
        listing = http.get("/v1/pipelines").json()["pipelines"]
        assert [(p["name"], p["default"], p["generation"]) for p in listing] == [
            ("wordcount", True, published["wordcount"].generation),
            ("payments", False, published["payments"].generation)]
        assert listing[1]["views"] == ["spend_by_user", "spend_by_user_hourly"]

        assert _problems(http, "/v1", published["wordcount"]) == []
        assert _problems(http, "/v1/pipelines/wordcount", published["wordcount"]) == []
        assert _problems(http, "/v1/pipelines/payments", published["payments"]) == []
        # The un-prefixed routes are the default pipeline's: payments' views are not there.
        assert http.get("/v1/views/spend_by_user/keys/alice").status_code == 404
        views = http.get("/v1/pipelines/payments/views").json()["views"]
        assert [v["name"] for v in views] == ["spend_by_user", "spend_by_user_hourly"]


def test_unknown_pipeline_is_404_naming_the_known_ones(
        two: tuple[Settings, dict[str, Published]], module_redis_url: str) -> None:
    from serving.api.app import create_app

    settings, _ = two
    with ApiServer(create_app(settings, redis_url=module_redis_url)) as server, \
            _client(server) as http:
        for method, path in (("POST", "/v1/pipelines/clicks/events"), ("GET", "/v1/pipelines/clicks/views"),
                             ("GET", "/v1/pipelines/clicks")):
            response = http.request(method, path, json={"text": "x"})
            assert response.status_code == 404, (path, response.text)
            body = response.json()
            assert body["error"] == "UnknownNameError" and "'clicks'" in body["detail"], body
            assert "'payments'" in body["detail"] and "'wordcount'" in body["detail"], body
        bare = http.get("/v1/pipelines/payments")
        assert bare.status_code == 404 and "/v1/pipelines/payments/views" in bare.json()["detail"]


def test_events_and_runs_go_to_the_addressed_pipeline(
        two: tuple[Settings, dict[str, Published]], module_redis_url: str) -> None:
    from serving.api.app import create_app

    settings, _ = two
    payment = {"user_id": "zed", "merchant": "acme", "amount": 2.5, "event_time": "2024-03-01T10:00:00Z"}
    paths = {name: settings.for_pipeline(name).master_path for name in settings.pipeline_names}
    before = {name: oracle.read_events(path) for name, path in paths.items()}
    with ApiServer(create_app(settings, redis_url=module_redis_url)) as server, \
            _client(server) as http:
        posted = http.post("/v1/pipelines/payments/events", json=payment)
        assert posted.status_code in (200, 202), posted.text
        refused = http.post("/v1/events", json=payment)  # the default pipeline's event model: no `text`
        assert refused.status_code == 422, refused.text

        queued = http.post("/v1/pipelines/payments/batch/runs")
        assert queued.status_code == 202, queued.text
        location = queued.headers["Location"]
        assert location == f"/v1/pipelines/payments/batch/runs/{queued.json()['id']}"
        assert http.get(location).json()["pipeline"] == "payments"
        assert http.get("/v1/batch/runs").json()["runs"] == []  # wordcount's registry saw no run

        metrics = http.get("/v1/pipelines/payments/metrics").text
        assert 'pipeline="payments"' in metrics

    after = {name: oracle.read_events(path) for name, path in paths.items()}
    assert after["wordcount"] == before["wordcount"]
    spend = sorted((e["user_id"], e["merchant"], e["amount"]) for e in after["payments"])
    assert spend == sorted([(e["user_id"], e["merchant"], e["amount"]) for e in before["payments"]]
                           + [("zed", "acme", 2.5)])
