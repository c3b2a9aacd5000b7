"""Batch runs over HTTP, against a real uvicorn server, Redis, Delta tables and (where a run must
happen) a scheduler thread on the session's SparkSession.

* ``POST /v1/batch/runs`` answers 202 with a queued run; the scheduler picks it up; ``GET`` shows
  it succeeded with the generation Redis now serves, which is a barrier's master version (read with
  ``deltalake``), the events and rows per view. A second POST meanwhile answers 409 naming it; a
  POST after it, with the master unchanged, is recorded as skipped.
* Ten concurrent POSTs: exactly one 202, nine 409 (single flight).
* A run whose scheduler died reads as failed ('interrupted') once its lease expired; then a POST
  is admitted again.
* Unknown run ids answer 404; a POST without the admin key answers 401; the OpenAPI page
  documents the routes and their fields.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pyarrow as pa
import pytest
import redis
from deltalake import DeltaTable

from serving.store.keys import Keys
from serving.store.runs import RunRegistry
from tests.support import ingest_texts, scheduler_thread, web

TEXTS = ["the quick brown fox", "the lazy dog", "the fox"]
#: Starting runs takes the ``admin`` scope; reads are open on loopback (serving.api.auth).
KEY = "test-admin-key-0001"
AUTH = {"Authorization": f"Bearer {KEY}"}
KEYS = {KEY: ["admin"]}


def wait_terminal(client: httpx.Client, run_id: str, timeout: float = 180) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        body = client.get(f"/v1/batch/runs/{run_id}").json()
        if body["status"] in ("succeeded", "failed", "skipped"):
            return body
        assert time.monotonic() < deadline, f"run {run_id} still {body['status']}"
        time.sleep(0.2)


@pytest.mark.slow  # over 2.5 s in a full run: the full tier (the quick tier has a 3-minute budget)
def test_post_is_picked_up_by_the_scheduler_and_served(spark, make_settings, api) -> None:
    settings = make_settings()
    version = ingest_texts(settings, TEXTS)
    with api(api_keys=KEYS) as server, web.client(base_url=server.base_url, timeout=10, headers=AUTH) as client:
        # Asked for before the scheduler starts: a scheduler that finds data and nothing served
        # recomputes on its own at start, which would take the single-flight slot first.
        posted = client.post("/v1/batch/runs")
        assert posted.status_code == 202, posted.text
        run = posted.json()
        assert run["status"] == "queued" and run["trigger"] == "api" and run["force"] is False
        assert posted.headers["location"] == f"/v1/batch/runs/{run['id']}"

        again = client.post("/v1/batch/runs", json={"force": True})
        assert again.status_code == 409, again.text
        assert again.json()["error"] == "ConflictError" and run["id"] in again.json()["detail"]
        assert again.headers["Location"] == f"/v1/batch/runs/{run['id']}"

        with scheduler_thread(spark, settings):
            done = wait_terminal(client, run["id"])
            assert done["status"] == "succeeded", done
            generation = done["generation"]
            assert done["master_version"] == version and generation == version + 1
            assert done["served"] is True and done["events"] == len(TEXTS)
            assert done["rows"]["word_counts"] == len({w for t in TEXTS for w in t.split()})
            assert done["duration_seconds"] > 0 and done["error"] is None and done["owner"]
            assert done["started_at"] >= done["requested_at"] and done["finished_at"] > done["started_at"]
            stages = {(s["name"], s["view"]): (s["count"], s["unit"]) for s in done["stages"]}
            assert stages[("barrier", None)] == stages[("flip", None)][:1] + ("master version",)
            assert stages[("snapshot", None)] == (len(TEXTS), "events")
            assert stages[("publish", "word_counts")] == (done["rows"]["word_counts"], "rows")

            # The generation is served, and it is a barrier commit of the master dataset.
            assert int(redis.Redis.from_url(settings.redis_url).get(Keys("wordcount").current)) == generation
            cdf = DeltaTable(str(settings.master_path)).load_cdf(starting_version=generation, ending_version=generation)
            assert pa.RecordBatchReader.from_stream(cdf).read_all().column("_kind").to_pylist() == ["barrier"]
            answer = client.get("/v1/views/word_counts/keys/the").json()
            assert answer["value"]["count"] == 3 and answer["generation"] == generation

            listed = client.get("/v1/batch/runs").json()
            assert listed["pipeline"] == "wordcount" and listed["active"] is None
            assert [r["id"] for r in listed["runs"]] == [run["id"]]
            assert len(listed["schedulers"]) == 1 and listed["schedulers"][0]["schedule"] is None

            # Nothing changed since: the next run asked for is recorded as skipped, newest first.
            skipped = client.post("/v1/batch/runs")
            assert skipped.status_code == 202
            skip = wait_terminal(client, skipped.json()["id"])
            assert skip["status"] == "skipped" and skip["generation"] == generation
            assert "has not changed since generation" in skip["skip_reason"]
            assert [r["id"] for r in client.get("/v1/batch/runs").json()["runs"]] == [skip["id"], run["id"]]
        assert DeltaTable(str(settings.master_path)).version() == generation, "a skip appends no barrier"


def test_concurrent_posts_admit_exactly_one_run(api) -> None:
    with api(api_keys=KEYS) as server:
        start = threading.Barrier(10)
        answers: list[httpx.Response] = []

        def post() -> None:
            with web.client(base_url=server.base_url, timeout=10, headers=AUTH) as client:
                start.wait()
                answers.append(client.post("/v1/batch/runs"))

        threads = [threading.Thread(target=post) for _ in range(10)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        statuses = sorted(a.status_code for a in answers)
        assert statuses == [202] + [409] * 9, statuses
        [accepted] = [a.json() for a in answers if a.status_code == 202]
        for refused in (a for a in answers if a.status_code == 409):
            assert f"batch run {accepted['id']} is already queued" in refused.json()["detail"]

        listed = web.get(f"{server.base_url}/v1/batch/runs", headers=AUTH).json()
        assert listed["active"] == accepted["id"] and listed["schedulers"] == []
        assert [(r["id"], r["status"]) for r in listed["runs"]] == [(accepted["id"], "queued")]


def test_a_run_left_by_a_dead_scheduler_reads_as_interrupted(api, make_settings) -> None:
    settings = make_settings()
    with api(api_keys=KEYS) as server, web.client(base_url=server.base_url, timeout=10, headers=AUTH) as client:
        run_id = client.post("/v1/batch/runs").json()["id"]
        # A scheduler claims it, then dies: no heartbeat renews its short lease.
        registry = RunRegistry.from_url(settings.redis_url, "wordcount")
        claimed, _ = registry.claim("dead-host:1:abc", lease_seconds=0.5, queued=True)
        assert claimed.id == run_id
        running = client.get(f"/v1/batch/runs/{run_id}").json()
        assert running["status"] == "running" and running["owner"] == "dead-host:1:abc"
        assert client.post("/v1/batch/runs").status_code == 409
        time.sleep(0.7)
        failed = client.get(f"/v1/batch/runs/{run_id}").json()
        assert failed["status"] == "failed" and failed["error"].startswith("interrupted: ")
        assert failed["finished_at"] == failed["heartbeat_at"]
        admitted = client.post("/v1/batch/runs")
        assert admitted.status_code == 202 and admitted.json()["id"] != run_id


def test_unknown_run_is_404_and_routes_are_documented(api) -> None:
    with api(api_keys=KEYS) as server, web.client(base_url=server.base_url, timeout=10, headers=AUTH) as client:
        missing = client.get("/v1/batch/runs/nope")
        assert missing.status_code == 404
        assert missing.json()["error"] == "NotFoundError" and "'nope'" in missing.json()["detail"]
        assert client.get("/v1/batch/runs", params={"limit": 0}).status_code == 422
        assert web.post(f"{server.base_url}/v1/batch/runs").status_code == 401
        assert client.get("/v1/batch/runs").json()["runs"] == [], "a refused request queues nothing"

        spec = client.get("/openapi.json").json()
        post = spec["paths"]["/v1/batch/runs"]["post"]
        assert {"202", "409"} <= post["responses"].keys()
        assert "404" in spec["paths"]["/v1/batch/runs/{run_id}"]["get"]["responses"]
        fields = spec["components"]["schemas"]["BatchRunInfo"]["properties"]
        for name in ("status", "master_version", "generation", "rows", "events", "duration_seconds", "error"):
            assert fields[name].get("description"), f"BatchRunInfo.{name} has no description"
