"""A changed pipeline logic is never mixed with the old one, and is served once recomputed.

Two versions of a word-count pipeline, v1 (words as written; views ``word_counts`` and
``first_letters``) and v2 (words lower-cased; ``word_counts`` and a new ``word_lengths``; no
``first_letters``), run against one master dataset, one Redis and one API: v1's batch and speed
layer serve; then the speed layer restarts with v2 (more events arrive); a batch run under v2 dies at
its flip (where a kill -9 of its process leaves it), so v1 stays served; then a batch run under v2
is served and more events arrive (a keys cursor of v1's rows is then refused: 409). A reader thread asks for keys over HTTP all along: every answer
must equal v1's oracle or v2's oracle at the answer's ``version``, as its ``logic`` says, never
anything else. Oracle: plain-Python counts over the events the test ingested, per version.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from typing import Any
from urllib.parse import quote

import pytest
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from batch_layer.faults import injected
from batch_layer.master.dataset import MasterDataset
from batch_layer.recompute.job import run_batch
from serving.api.app import create_app
from shared_logic.measures import Count
from shared_logic.pipeline import Pipeline
from shared_logic.pipelines.wordcount import Line
from shared_logic.views import View
from tests.oracle import words
from tests.support import web
from tests.support.dying import Died, die
from tests.support.servers import ApiServer
from tests.support.speed import processed_version, running_speed_layer

pytestmark = pytest.mark.slow

VOCABULARY = ["Apache", "apache", "Spark", "spark", "Delta", "redis", "Lambda", "lambda", "x"]


class WordsV1(Pipeline):
    name = "wordcount"
    event_model = Line
    logic_version = "v1"
    views = (View("word_counts", keys=("word",), measures=(Count(),)),
             View("first_letters", keys=("letter",), measures=(Count(),)))

    def transform(self, events: DataFrame) -> DataFrame:
        found = events.select(F.explode(F.split(F.col("text"), r"\s+")).alias("word"), "event_time")
        found = found.where(F.col("word") != "")
        return found.withColumn("letter", F.substring("word", 1, 1))


class WordsV2(Pipeline):
    name = "wordcount"
    event_model = Line
    logic_version = "v2"
    views = (View("word_counts", keys=("word",), measures=(Count(),)),
             View("word_lengths", keys=("length",), measures=(Count(),)))

    def transform(self, events: DataFrame) -> DataFrame:
        found = events.select(F.explode(F.split(F.lower(F.col("text")), r"\s+")).alias("word"), "event_time")
        found = found.where(F.col("word") != "")
        return found.withColumn("length", F.length("word").cast("string"))


V1, V2 = WordsV1(), WordsV2()


def oracle(texts: list[str], logic: str) -> dict[str, Counter[str]]:
    """Every view's counts under one logic, from the texts."""
    if logic == V1.logic:
        found = [w for t in texts for w in words(t)]
        return {"word_counts": Counter(found), "first_letters": Counter(w[0] for w in found)}
    found = [w for t in texts for w in words(t.lower())]
    return {"word_counts": Counter(found), "word_lengths": Counter(str(len(w)) for w in found)}


def definitions(pipeline: Pipeline) -> dict[str, str]:
    """What the API checks a generation's views against (as ``create_app`` gives its store)."""
    return {view.name: repr(view) for view in pipeline.views}


class History:
    """The texts of every master version, to compute the oracle at any version."""

    def __init__(self) -> None:
        self.by_version: dict[int, list[str]] = {}

    def texts_through(self, version: int) -> list[str]:
        return [t for v, texts in self.by_version.items() if v <= version for t in texts]


def ingest(master: MasterDataset, history: History, rng: random.Random, n: int) -> int:
    texts = [" ".join(rng.choice(VOCABULARY) for _ in range(rng.randint(1, 5))) for _ in range(n)]
    version = master.append(V1.schema.validate([{"text": t} for t in texts]))
    history.by_version[version] = texts
    return version


def wait_for(condition: Any, what: str, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


def test_a_changed_logic_is_never_mixed_and_is_served_once_recomputed(spark, make_settings) -> None:
    settings = make_settings(pipeline="wordcount")
    master = MasterDataset.open(settings, V1)
    history, rng = History(), random.Random(11)
    assert V1.logic != V2.logic
    ingest(master, history, rng, 40)
    run_batch(spark, settings, V1, redis_url=settings.redis_url)

    app = create_app(settings, redis_url=settings.redis_url)
    app.state.pipeline = V1  # the API runs v1's code (create_app loaded the settings' built-in)
    seen: list[tuple[str, str, int, str | None, int]] = []  # (view, key, version, logic, value)
    problems: list[str] = []
    stop = threading.Event()

    def reader(base_url: str) -> None:
        with web.client(base_url=base_url, timeout=10) as http:
            while not stop.is_set():
                for view, key in (("word_counts", "apache"), ("word_counts", "Apache"), ("word_counts", "spark")):
                    answer = http.get(f"/v1/views/{view}/keys/{quote(key)}")
                    if answer.status_code == 404:
                        continue  # a key the logic of the moment does not have (v2 has no 'Apache')
                    if answer.status_code != 200:
                        problems.append(f"{view}/{key}: {answer.status_code} {answer.text}")
                        continue
                    body = answer.json()
                    seen.append((view, key, body["version"], body.get("logic"), body["value"]["count"]))

    with ApiServer(app) as server:
        app.state.store.definitions = definitions(V1)
        thread = threading.Thread(target=reader, args=(server.base_url,), daemon=True)
        thread.start()
        try:
            with running_speed_layer(spark, settings, V1) as speed:
                ingest(master, history, rng, 30)
                wait_for(lambda: (processed_version(settings) or -1) >= master.latest_version(), "v1 speed layer")
                assert speed.is_alive()
            v1_processed = processed_version(settings)

            app.state.pipeline, app.state.store.definitions = V2, definitions(V2)  # the API restarted with v2's code
            with running_speed_layer(spark, settings, V2):
                ingest(master, history, rng, 30)
                time.sleep(6)  # the v2 speed layer reads it, and must not add it to v1's segment
                assert processed_version(settings) == v1_processed, "v2's increments went into a v1 segment"
                with web.client(base_url=server.base_url, timeout=10) as http:
                    listed = http.get("/v1/views").json()
                    assert listed["served_logic"] == V1.logic and listed["pending_logic"] == V2.logic
                    assert [v["name"] for v in listed["views"] if v["pending"]] == ["word_lengths"]
                    pending = http.get("/v1/views/word_lengths/keys/5")
                    assert pending.status_code == 503 and "not in the served batch generation" in pending.json()["detail"]
                    assert http.get("/v1/views/word_lengths/top").status_code == 503

                with injected("before-flip", die), pytest.raises(Died):  # v2's first recompute dies at its flip
                    run_batch(spark, settings, V2, redis_url=settings.redis_url)
                with web.client(base_url=server.base_url, timeout=10) as http:
                    listed = http.get("/v1/views").json()
                    assert listed["served_logic"] == V1.logic and listed["pending_logic"] == V2.logic, listed
                    paging = http.get("/v1/views/word_counts/keys", params={"limit": 2}).json()  # v1's rows
                result = run_batch(spark, settings, V2, redis_url=settings.redis_url)
                assert result.flipped
                with web.client(base_url=server.base_url, timeout=10) as http:  # v2's rows are another set
                    params = {"limit": 2, "cursor": paging["next_cursor"]}
                    refused = http.get("/v1/views/word_counts/keys", params=params)
                    assert refused.status_code == 409 and "other logic" in refused.json()["detail"], refused.text
                    streamed = http.get("/v1/views/word_counts/keys", params=params, headers={"Accept": "text/csv"})
                    assert streamed.status_code == 409, streamed.text
                ingest(master, history, rng, 30)
                wait_for(lambda: (processed_version(settings) or -1) >= master.latest_version(), "v2 speed layer")
                latest = master.latest_version()
                with web.client(base_url=server.base_url, timeout=10) as http:
                    want = oracle(history.texts_through(latest), V2.logic)
                    for view in ("word_counts", "word_lengths"):
                        for key, count in want[view].items():
                            body = http.get(f"/v1/views/{view}/keys/{quote(key)}").json()
                            assert (body["value"]["count"], body["logic"], body["version"]) == (count, V2.logic, latest)
                    assert http.get("/v1/views/first_letters/keys/a").status_code == 404
        finally:
            stop.set()
            thread.join(30)

    assert not problems, "\n".join(problems[:3])
    logics = {logic for _, _, _, logic, _ in seen}
    assert logics == {V1.logic, V2.logic}, "the reader saw both logics"
    for view, key, version, logic, value in seen:
        want = oracle(history.texts_through(version), logic or "")[view].get(key, 0)
        assert value == want, f"{view}/{key} at version {version} under {logic}: {value}, oracle {want}"
