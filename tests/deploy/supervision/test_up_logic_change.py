"""A user's pipeline edited while `up` runs: recomputed by itself, served by itself, never mixed.

A word-count module of the user's, v1 (words as written; views ``word_counts`` and ``first_letters``),
runs under `up` with events posted over HTTP. While it runs, the module is replaced by v2 (words
lower-cased; ``word_counts``, a new ``word_lengths``, a new sliding view ``words_last_hour`` and a new
session view ``word_sessions``, a 1 s gap and four sessions kept a word; no ``first_letters``). The API,
the speed layer and the scheduler each see the file change and stop, `up` starts them on v2's code
(``deploy.supervision.code_watch``), and nobody runs a batch recompute by hand (the schedule is an hour):
the scheduler recomputes under v2 by itself. (`up` stopped and started again on changed code starts every
part on it from the first: the scheduler side of that, a new logic's scheduler recomputing by itself, is
``tests/deploy/scheduling/test_scheduler.py``.) Each post's events carry event times in two groups seconds
apart (or none: the ingest time), so each word gets two sessions or so a post.

A reader thread asks for keys over HTTP all along. The oracle is plain Python over the master
dataset's events at the version an answer names (read from the Delta table by ``tests.oracle``):
every answer must equal v1's oracle or v2's, as its ``logic`` says. At the end every key of every
v2 view equals v2's oracle (the sliding view's window ending now: its panes combined; every word's sessions: a
gap sessionization of its event times, the newest four kept and the older ones, several a word, in the folded
summary, exact after them), ``first_letters`` is gone, and the served logic is v2's.

A v2 recompute killed midway leaves v1 served and the next one serves v2: that claim is about state, so it is
proven in process (tests/speed_layer/test_logic_change.py, a v2 run dying at its flip); a kill -9 of `up`'s
whole tree is the chaos test's ``up`` fault (tests/chaos/test_chaos.py).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path
from urllib.parse import quote

import httpx
import pandas as pd
import psutil
import pytest

from tests import oracle
from tests.support import free_port, web, window_oracle
from tests.support.platform import KEY, wait_up
from tests.support.window_checks import MICROS, micros, rows, spans, word_times

pytestmark = [pytest.mark.slow, pytest.mark.uses_platform]

_HEAD = '''
from datetime import datetime

from pyspark.sql import functions as F

from shared_logic.measures import Count
from shared_logic.pipeline import EventModel, Pipeline
from shared_logic.views import View


class Line(EventModel):
    text: str
    event_time: datetime | None = None
'''
V1_SOURCE = _HEAD + '''

class MyWords(Pipeline):
    name = "mywords"
    event_model = Line
    views = (View("word_counts", keys=("word",), measures=(Count(),)),
             View("first_letters", keys=("letter",), measures=(Count(),)))

    def transform(self, events):
        found = events.select(F.explode(F.split(F.col("text"), r"\\s+")).alias("word"), "event_time")
        return found.where(F.col("word") != "").withColumn("letter", F.substring("word", 1, 1))


pipeline = MyWords()
'''
#: v2's session view: a word's sessions are runs of its event times no more than GAP seconds apart; KEEP kept.
GAP, KEEP = 1, 4
V2_SOURCE = _HEAD + f'''
from datetime import timedelta

from shared_logic.sessions import SessionWindow
from shared_logic.views import SlidingWindow


class MyWords(Pipeline):
    name = "mywords"
    event_model = Line
    views = (View("word_counts", keys=("word",), measures=(Count(),)),
             View("word_lengths", keys=("length",), measures=(Count(),)),
             View("words_last_hour", keys=("word",), measures=(Count(),),
                  window=SlidingWindow(timedelta(hours=1), timedelta(minutes=5))),
             View("word_sessions", keys=("word",), measures=(Count(),),
                  sessions=SessionWindow(timedelta(seconds={GAP}), max_sessions={KEEP})))

    def transform(self, events):
        found = events.select(F.explode(F.split(F.lower(F.col("text")), r"\\s+")).alias("word"), "event_time")
        return found.where(F.col("word") != "").withColumn("length", F.length("word").cast("string"))


pipeline = MyWords()
'''
VOCABULARY = ["Apache", "apache", "Spark", "spark", "Delta", "redis", "Lambda", "lambda", "x"]
#: Seconds before a post's time its events carry as event time (None: none sent, the ingest time is theirs): two
#: groups more than GAP apart, so a word gets two sessions a post (three if the ingest time lags by over GAP).
SPREAD = (0.0, 0.4, 0.9, 2.5, 3.0, None, None)
ASKED = [("word_counts", "apache"), ("word_counts", "Apache"), ("word_counts", "spark"),
         ("first_letters", "A"), ("word_lengths", "5")]


def expected(texts: list[str], lowered: bool) -> dict[str, Counter[str]]:
    """Every view's counts under v1 (``lowered`` False) or v2, from the texts."""
    found = [w for t in texts for w in oracle.words(t.lower() if lowered else t)]
    if lowered:
        return {"word_counts": Counter(found), "word_lengths": Counter(str(len(w)) for w in found)}
    return {"word_counts": Counter(found), "first_letters": Counter(w[0] for w in found)}


class Platform:
    """`up` on one data dir, started and killed by the test."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.port = folder, free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("LAMBDA_")}
        repo = str(Path(__file__).resolve().parents[3])  # this checkout's code, whatever is installed
        self.env.update({
            "PYTHONPATH": os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")])),
            "LAMBDA_PIPELINE": "mywords", "LAMBDA_HTTP_PORT": str(self.port), "LAMBDA_BATCH_SCHEDULE": "1h",
            "LAMBDA_API_KEYS": json.dumps({KEY: ["read", "ingest", "admin"]}), "LAMBDA_SPARK_MASTER": "local[2]",
            "LAMBDA_SPARK_SHUFFLE_PARTITIONS": "2",
            "LAMBDA_SPEED_TRIGGER_SECONDS": "0.5", "LAMBDA_ENV_FILE": os.devnull,
        })
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, source: str) -> None:
        (self.folder / "mywords.py").write_text(source)
        log = (self.folder.parent / "up.log").open("ab")
        self.process = subprocess.Popen([sys.executable, "-m", "deploy.cli", "up", "--no-generate"],
                                        cwd=self.folder, env=self.env, stdout=log, stderr=subprocess.STDOUT)

    def kill(self) -> None:
        """SIGKILL `up` and every process under it (each child leads a session of its own)."""
        assert self.process is not None
        parent = psutil.Process(self.process.pid)
        for process in [*parent.children(recursive=True), parent]:
            try:
                process.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                pass
        self.process.wait(30)


def _reader(base: str, stop: threading.Event, seen: list[tuple[str, str, int, str, int]], problems: list[str]) -> None:
    with web.client(base_url=base, timeout=10, headers={"Authorization": f"Bearer {KEY}"}) as http:
        while not stop.is_set():
            for view, key in ASKED:
                try:
                    answer = http.get(f"/v1/views/{view}/keys/{quote(key)}")
                except httpx.TransportError:
                    time.sleep(0.2)  # `up` restarting
                    continue
                if answer.status_code in (404, 503):
                    continue  # a key or view the logic of the moment does not have, or not ready
                if answer.status_code != 200:
                    problems.append(f"{view}/{key}: {answer.status_code} {answer.text}")
                    continue
                body = answer.json()
                seen.append((view, key, body["version"], body["logic"], body["value"]["count"]))
            time.sleep(0.25)  # a round of five keys four times a second: the platform's CPU is for `up` itself


class Poster:
    """Posts lines of the vocabulary, their event times within SPREAD before the post. Posts lie more than GAP
    apart in time (it waits when need be), so no session spans two; a post is one commit of one file, which a
    micro-batch reads whole. So wherever the batch/speed split and the micro-batches fell, the newest KEEP sessions
    are kept and the older ones folded, as the oracle has it (``merge_parts`` folds only whole posts' sessions)."""

    def __init__(self, http: httpx.Client, rng: random.Random) -> None:
        self.http, self.rng, self.done = http, rng, 0.0

    def __call__(self, n: int) -> None:
        time.sleep(max(0.0, self.done + max(s for s in SPREAD if s is not None) + GAP + 0.5 - time.time()))
        now, lines = datetime.now(timezone.utc), []
        for _ in range(n):
            line: dict[str, str] = {"text": " ".join(self.rng.choice(VOCABULARY) for _ in range(self.rng.randint(1, 5)))}
            before = self.rng.choice(SPREAD)
            if before is not None:
                line["event_time"] = (now - timedelta(seconds=before)).isoformat()
            lines.append(line)
        response = self.http.post("/v1/events", json=lines)
        assert response.status_code == 202, response.text
        self.done = time.time()  # the ingest time of events without one is earlier


def test_a_changed_pipeline_is_recomputed_and_served_by_up_never_mixed(tmp_path: Path) -> None:
    folder = tmp_path / "mine"
    folder.mkdir()
    master = folder / "data" / "master" / "mywords"
    platform, rng = Platform(folder), random.Random(5)
    seen: list[tuple[str, str, int, str, int]] = []
    problems: list[str] = []
    stop = threading.Event()
    reader = threading.Thread(target=_reader, args=(platform.base, stop, seen, problems), daemon=True)
    http = web.client(base_url=platform.base, timeout=30, headers={"Authorization": f"Bearer {KEY}"})
    post = Poster(http, rng)
    try:
        platform.start(V1_SOURCE)
        wait_up(lambda: http.get("/healthz").status_code == 200, "the API")
        post(40)
        wait_up(lambda: http.get("/readyz").status_code == 200, "v1's first generation", 600)
        v1 = http.get("/v1/views").json()["logic"]
        reader.start()
        post(20)
        wait_up(lambda: _version(http) >= _latest(master), "v1's speed layer", 300)
        # (on a loaded machine the reader's first answers may come after the catch-up: v1 must be in them)
        wait_up(lambda: any(logic == v1 for *_, logic, _ in list(seen)), "the reader's first answer under v1", 120)

        (folder / "mywords.py").write_text(V2_SOURCE)  # edited in place, `up` running
        wait_up(lambda: http.get("/v1/views").json()["logic"] != v1, "the API restarted by `up` on v2's code")
        v2 = http.get("/v1/views").json()["logic"]
        post(20)
        wait_up(lambda: _converged(http, v2), "v2 recomputed by `up` itself, served, nothing pending", 600)
        post(20)
        latest = _latest(master)
        wait_up(lambda: _version(http) >= latest, "v2's speed layer", 300)
        # (v2 may be served and caught up moments before the reader's next round: v2 must be in its answers)
        wait_up(lambda: any(logic == v2 for *_, logic, _ in list(seen)), "the reader's first answer under v2", 120)
        stop.set()
        reader.join(30)

        want = expected(_texts(master, latest), lowered=True)
        for view, counts in want.items():
            listed = http.get(f"/v1/views/{view}/keys", params={"limit": 1000}).json()
            got = {entry["key"]: entry["value"]["count"] for entry in listed["keys"]}
            assert got == dict(counts), view
        assert http.get("/v1/views/first_letters/keys/A").status_code == 404
        _sliding_view_is_exact(http, master)
        _session_view_is_exact(http, master)
    finally:  # killed, not stopped: a stop waits for the speed layer's micro-batch (SIGTERM: the chaos test)
        stop.set()
        http.close()
        if platform.process is not None and platform.process.poll() is None:
            platform.kill()

    assert not problems, "\n".join(problems[:3])
    assert {logic for *_, logic, _ in seen} == {v1, v2}, "the reader saw both logics"
    texts: dict[int, list[str]] = {}
    for view, key, version, logic, value in seen:
        assert logic in (v1, v2), logic
        if version not in texts:
            texts[version] = _texts(master, version)
        want = expected(texts[version], lowered=logic == v2)[view].get(key, 0)
        assert value == want, f"{view}/{key} at version {version} under {'v2' if logic == v2 else 'v1'}: {value}, " \
                              f"oracle {want}"


def _sliding_view_is_exact(http: httpx.Client, master: Path) -> None:
    """v2's sliding view under `up`: the top words of the window ending now (its twelve panes combined, batch and
    realtime parts) are the lower-cased words of the events whose time lies in that window."""
    top = http.get("/v1/views/words_last_hour/top", params={"window_end": "now", "n": 100}).json()
    start, end = (datetime.fromisoformat(top["window"][k].replace("Z", "+00:00")) for k in ("start", "end"))
    assert top["now"] and end - start == timedelta(hours=1), top
    texts = [e["text"] for e in oracle.read_events(master, top["version"]) if start <= oracle.as_utc(e["event_time"]) < end]
    want = Counter(w for t in texts for w in oracle.words(t.lower()))
    assert want and {e["key"]: e["value"] for e in top["top"]} == dict(want), top


def _session_view_is_exact(http: httpx.Client, master: Path) -> None:
    """v2's session view under `up`: each word's sessions equal a gap sessionization (``tests.support.window_oracle``)
    of its event times in the master's events at the version answered. Several a word are folded: the newest KEEP
    are kept, the summary of the older ones is theirs, all time is marked inexact, and after the folded span (and
    the gap) it is exact."""
    words = sorted({w.lower() for w in VOCABULARY})
    frames: dict[int, pd.DataFrame] = {}
    for word in words:
        body = http.get(f"/v1/views/word_sessions/sessions/keys/{word}").json()
        if body["version"] not in frames:
            frames[body["version"]] = window_oracle.sessionize(word_times(master, body["version"], lower=True), "word",
                                                                GAP * MICROS)
        sessions = frames[body["version"]]
        mine = sessions[sessions.word == word]
        kept, folded = mine.iloc[-KEEP:], mine.iloc[:-KEEP]
        assert len(folded) > 0 and spans(body["sessions"]) == rows(kept) and not body["exact"], (word, body)
        lengths, every = folded.end - folded.start, mine.end - mine.start
        f = body["folded"]
        assert (f["sessions"], micros(f["first_start"]), micros(f["last_end"]), f["total_duration"], f["longest"],
                f["value"]) == (len(folded), int(folded.start.min()), int(folded.end.max()), int(lengths.sum()) / MICROS,
                                int(lengths.max()) / MICROS, {"count": int(folded["count"].sum())}), (word, f)
        summary = http.get(f"/v1/views/word_sessions/sessions/summary/{word}").json()
        assert (summary["sessions"], summary["folded"], summary["total_duration"], summary["longest"]) == \
            (len(mine), len(folded), int(every.sum()) / MICROS, int(every.max()) / MICROS), (word, summary)
        after = int(folded.end.max()) + GAP * MICROS + 1
        later = http.get(f"/v1/views/word_sessions/sessions/keys/{word}",
                         params={"from": f"{after // MICROS}.{after % MICROS:06d}", "to": "now"}).json()
        assert later["exact"] and spans(later["sessions"]) == rows(kept), (word, later)


def _latest(master: Path) -> int:
    return max(int(p.stem) for p in (master / "_delta_log").glob("*.json"))


def _version(http: httpx.Client) -> int:
    """The master version ``word_counts`` answers are exact for (-1: not served)."""
    views = {view["name"]: view for view in http.get("/v1/views").json().get("views", [])}
    return views.get("word_counts", {}).get("version") or -1


def _texts(master: Path, version: int) -> list[str]:
    return [event["text"] for event in oracle.read_events(master, version)]


def _converged(http: httpx.Client, logic: str) -> bool:
    views = http.get("/v1/views").json()
    return views.get("served_logic") == logic and views.get("pending_logic") is None
