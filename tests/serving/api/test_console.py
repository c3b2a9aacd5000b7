"""The web console (``/console``) in Debian's headless chromium against a real API, Redis and Spark.

A batch generation of the composite-key flights pipeline is published from real events and a
realtime segment written on top of it (``tests.support.flights``, as in ``test_key_pages``). Each page is loaded in the
browser (driven through chromedriver, kept off the network: every host but 127.0.0.1 resolves to
nothing) and the numbers it shows (each element carries its number raw in ``data-value``) are
compared with the API's own answers and with a pandas oracle over the events. Screenshots go to
``test-artifacts/console/`` (``LAMBDA_TEST_ARTIFACTS`` moves it).

A sliding view (``tests.support.trending_pipeline``, plays in the last minutes of the real clock) shows its
window kind and the top-N of the window ending now as a bar chart that asks again by itself: after a new
generation is published the chart shows it, equal to the API's top-N of the window it names at its version.
A session view (``tests.support.visits_pipeline``) shows its top keys by session count and longest session, and a
key's sessions as a timeline over a table (all time, a range, folded sessions of the bounded view), equal to the
API's answers and to a plain-Python sessionization of the events written (``tests.support.window_oracle.gap_runs``).
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pandas as pd
import pytest
from selenium.common.exceptions import StaleElementReferenceException

from batch_layer.recompute.job import run_batch
from deploy.settings import Settings
from shared_logic.registry import load_pipeline
from tests.support import ingest_file, key_url, wait_for, web
from tests.support.browser import field, load, raw, values
from tests.support.flights import AIRPORTS, ALL, HOURLY, PIPELINE, encoded, flights, oracle, write_realtime
from tests.support.visits_pipeline import GAP, KEEP
from tests.support.window_oracle import gap_runs

ADMIN = "console-admin-key"
TRENDING = "tests.support.trending_pipeline"


def window_kind(view: dict[str, Any]) -> str:
    """How the console names a view's windows, from GET /v1/views (written out here, not taken from the page)."""
    def spoken(seconds: int) -> str:
        parts, left = [], seconds
        for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
            if left >= size:
                parts.append(f"{left // size} {unit}")
                left %= size
        return " ".join(parts)

    if view["window_seconds"] is None:
        return "all time"
    if view["slide_seconds"] is None:
        return f"tumbling {spoken(view['window_seconds'])}"
    return f"sliding {spoken(view['window_seconds'])} every {spoken(view['slide_seconds'])}"


@pytest.fixture
def served(spark: Any, make_settings: Callable[..., Settings], tmp_path: Path) -> dict[str, Any]:
    """A served generation and a realtime segment over it; the events of both."""
    settings = make_settings(pipeline=PIPELINE)
    rng = random.Random(11)
    first, realtime = flights(rng, 120, AIRPORTS[:4]), flights(rng, 40, AIRPORTS[:5])
    ingest_file(settings, first, tmp_path / "e1.jsonl")
    generation = run_batch(spark, settings, load_pipeline(PIPELINE), redis_url=settings.redis_url).generation
    processed = ingest_file(settings, realtime, tmp_path / "e2.jsonl").version
    write_realtime(spark, settings, generation, realtime, processed)
    return {"first": first, "realtime": realtime, "generation": generation, "processed": processed}


@pytest.mark.slow
def test_console_pages_show_the_api_answers(browser: Any, served: dict[str, Any], api: Callable[..., Any],
                                            artifacts: Path) -> None:
    console_shots = artifacts / "console"
    console_shots.mkdir(exist_ok=True)
    events = served["first"] + served["realtime"]
    merged, hourly = oracle(events), oracle(events, hourly=True)
    with api(pipeline=PIPELINE, api_keys={ADMIN: ["read", "ingest", "admin"]}) as server, \
            web.client(base_url=server.base_url, timeout=30) as client:
        console = f"{server.base_url}/console"

        # Overview: the served generation, versions and rows are the API's (GET /v1/views).
        load(browser, console, "overview")
        listing = client.get("/v1/views").json()
        card = "section[data-pipeline='flights']"
        assert int(field(browser, "generation", card)) == served["generation"] == listing["views"][0]["generation"]
        assert int(field(browser, "latest_version", card)) == listing["latest_version"] == served["processed"]
        for name in ("processed_version", "lag_versions"):  # no speed layer runs: null, shown as a dash
            assert field(browser, name, card) == raw(listing[name])
        for view in listing["views"]:
            shown = values(browser, f"{card} tr[data-view='{view['name']}'] [data-field='rows']")
            assert shown == [str(view["rows"])]
            assert values(browser, f"{card} tr[data-view='{view['name']}'] [data-field='window']") == [window_kind(view)]
        assert {v["name"]: window_kind(v) for v in listing["views"]} == {ALL: "all time", HOURLY: "tumbling 1 h"}
        assert values(browser, f"{card} tr[data-view='{ALL}'] [data-field='rows']") == [str(len(oracle(served["first"])))]
        wait_for(lambda: len(browser.find_elements("css selector", f"{card} svg[data-chart='lag'] circle")) >= 2,
                 "two points on the live lag chart", 30)
        browser.save_screenshot(str(console_shots / "overview.png"))

        # A view: the top-N chart, and one key's batch, realtime and merged parts (explain=true).
        key = encoded("JFK", "LAX")
        assert (key, None) in oracle(served["first"]) and (key, None) in oracle(served["realtime"]), "the key needs both parts"
        load(browser, f"{console}#/pipelines/flights/views/{ALL}?key={quote(key, safe='')}&n=5&measure=count", "view")
        top = client.get(f"/v1/views/{ALL}/top", params={"n": 5, "measure": "count"}).json()["top"]
        bars = browser.find_elements("css selector", "svg[data-chart='top'] g[data-key]")
        assert [(b.get_attribute("data-key"), int(b.get_attribute("data-value"))) for b in bars] == \
            [(t["key"], t["value"]) for t in top]
        counts = sorted((-v["count"], k) for (k, _), v in merged.items())
        assert [(t["key"], t["value"]) for t in top] == [(k, -c) for c, k in counts[:5]]
        answer = client.get(key_url(ALL, key), params={"explain": "true"}).json()
        for measure, value in merged[(key, None)].items():
            row = f"#explain tr[data-measure='{measure}']"
            assert int(field(browser, f"value.{measure}", row)) == value == answer["value"][measure]
            assert int(field(browser, f"batch.{measure}", row)) == answer["explain"]["batch"][measure]
            assert int(field(browser, f"realtime.{measure}", row)) == answer["explain"]["realtime"][measure]
        batch_part = oracle(served["first"]).get((key, None), {}).get("count", 0)
        assert int(field(browser, "batch.count", "#explain")) == batch_part
        page = client.get(f"/v1/views/{ALL}/keys", params={"limit": 20}).json()
        assert values(browser, "#keys tr[data-key]", "data-key") == [k["key"] for k in page["keys"]]
        browser.save_screenshot(str(console_shots / "view.png"))

        # A windowed key over a range: one point per window, the oracle's counts.
        windows = sorted(ws for (k, ws) in hourly if k == key)
        start, end = windows[0], windows[-1] + 3600
        load(browser, f"{console}#/pipelines/flights/views/{HOURLY}?key={quote(key, safe='')}&from={start}&to={end}"
                      "&measure=count", "view")
        dots = browser.find_elements("css selector", "svg[data-chart='windows'] circle")
        want = [hourly[(key, ws)]["count"] for ws in windows]
        assert [int(d.get_attribute("data-value")) for d in dots] == want
        ranged = client.get(f"/v1/views/{HOURLY}/keys", params={"limit": 20, "from": start, "to": end}).json()
        assert values(browser, "#keys tr[data-key]", "data-key") == [k["key"] for k in ranged["keys"]]
        browser.save_screenshot(str(console_shots / "view-windowed.png"))

        # Batch runs: starting one needs the admin key; entered once, it is kept for the tab's session.
        load(browser, f"{console}#/pipelines/flights/runs", "runs")
        assert values(browser, "li[data-run-id]", "data-run-id") == [r["id"] for r in client.get("/v1/batch/runs").json()["runs"]]
        browser.find_element("id", "run-start").click()
        wait_for(lambda: "401" in browser.find_element("id", "run-outcome").text, "the refusal without a key", 30)
        browser.find_element("id", "api-key").send_keys(ADMIN)
        browser.find_element("id", "api-key-save").click()
        wait_for(lambda: browser.execute_script("return document.body.dataset.loaded") == "runs", "the runs page", 30)
        browser.find_element("id", "run-start").click()
        wait_for(lambda: browser.find_element("id", "run-outcome").get_attribute("data-run-id"), "a queued run", 30)
        run_id = browser.find_element("id", "run-outcome").get_attribute("data-run-id")
        run = client.get(f"/v1/batch/runs/{run_id}").json()
        assert run["status"] == "queued" and run["trigger"] == "api"
        wait_for(lambda: run_id in values(browser, "li[data-run-id]", "data-run-id"), "the run in the timeline", 30)
        assert browser.execute_script("return sessionStorage.getItem('lambda.console.apiKey')") == ADMIN
        assert not browser.get_cookies(), "the key is never a cookie"
        browser.save_screenshot(str(console_shots / "runs.png"))


def test_console_files_are_served_with_a_strict_policy(api: Callable[..., Any]) -> None:
    with api(pipeline=PIPELINE) as server, web.client(base_url=server.base_url, timeout=30) as client:
        page = client.get("/console")
        assert page.status_code == 200 and "console/console.js" in page.text
        assert "script-src 'self'" in page.headers["content-security-policy"]
        assert client.get("/console/console.js").headers["content-type"].startswith("text/javascript")
        missing = client.get("/console/app.js")
        assert missing.status_code == 404 and "console.css" in missing.json()["detail"]
        assert client.get("/console/..%2Fconsole.py").status_code == 404
        assert "/console" not in client.get("/openapi.json").json()["paths"]


def _plays(rng: random.Random, now: float, n: int, within: int, songs: list[str]) -> list[dict[str, Any]]:
    return [{"song": rng.choice(songs), "seconds": rng.randint(1, 300), "listener": f"user-{rng.randrange(20)}",
             "event_time": str(int(now) - rng.randrange(within))} for _ in range(n)]


def _live_chart(browser: Any) -> tuple[str, int, list[tuple[str, int]]]:
    """The live card's window end, version and bars (key, value), as the page carries them: read again when the
    chart was redrawn under the read (its refresh replaces the card's elements)."""
    for _ in range(20):
        try:
            bars = browser.find_elements("css selector", "#live-top svg[data-chart='live-top'] g[data-key]")
            return (field(browser, "live.window_end", "#live-top"), int(field(browser, "live.version", "#live-top")),
                    [(b.get_attribute("data-key"), int(b.get_attribute("data-value"))) for b in bars])
        except StaleElementReferenceException:
            continue
    raise AssertionError("the live chart was redrawn under every one of 20 reads")


@pytest.mark.slow
def test_a_sliding_view_shows_its_kind_and_a_live_top_of_the_window_ending_now(
        browser: Any, spark: Any, make_settings: Callable[..., Settings], api: Callable[..., Any], tmp_path: Path,
        artifacts: Path) -> None:
    settings = make_settings(pipeline=TRENDING)
    rng = random.Random(5)
    songs = [f"song-{i}" for i in range(12)]
    events = _plays(rng, time.time(), 150, 600, songs)
    ingest_file(settings, events, tmp_path / "plays.jsonl")
    run_batch(spark, settings, load_pipeline(TRENDING), redis_url=settings.redis_url)
    with api(pipeline=TRENDING) as server, web.client(base_url=server.base_url, timeout=30) as client:
        console = f"{server.base_url}/console"
        load(browser, console, "overview")
        listing = client.get("/v1/views").json()["views"]
        for view in listing:
            assert values(browser, f"tr[data-view='{view['name']}'] [data-field='window']") == [window_kind(view)]
        assert {window_kind(v) for v in listing} == {"sliding 20 m every 5 m"}

        load(browser, f"{console}#/pipelines/trending/views/plays_trending?n=5", "view")
        assert field(browser, "window", "section.card") == "sliding 20 m every 5 m"
        end, version, bars = _live_chart(browser)
        top = client.get("/v1/views/plays_trending/top", params={"window_end": end, "n": 5}).json()
        assert (version, bars) == (top["version"], [(t["key"], t["value"]) for t in top["top"]])
        frame = pd.DataFrame(events).assign(t=lambda f: f.event_time.astype(int))
        stop = int(pd.Timestamp(end).timestamp())
        counts = frame[(frame.t >= stop - 1200) & (frame.t < stop)].groupby("song").size()
        assert bars == sorted(((k, int(v)) for k, v in counts.items()), key=lambda kv: (-kv[1], kv[0]))[:5]
        browser.save_screenshot(str(artifacts / "console" / "view-sliding.png"))

        # New plays (a song that tops the chart) and a new generation: the chart shows it without a reload.
        hits = _plays(rng, time.time(), 60, 120, ["zz-hit"])
        ingest_file(settings, hits, tmp_path / "hits.jsonl")
        flipped = run_batch(spark, settings, load_pipeline(TRENDING), redis_url=settings.redis_url).generation
        wait_for(lambda: _live_chart(browser)[1] == flipped, "the live chart at the new generation", 30)
        end, version, bars = _live_chart(browser)
        top = client.get("/v1/views/plays_trending/top", params={"window_end": end, "n": 5}).json()
        assert (version, bars) == (top["version"], [(t["key"], t["value"]) for t in top["top"]]) and bars[0][0] == "zz-hit"


def _oracle_sessions(events: list[dict[str, Any]], user: str) -> list[tuple[int, int, float, dict[str, int]]]:
    """``user``'s sessions of the events (``tests.support.window_oracle.gap_runs``): (start, end, duration, measures), times
    in epoch seconds."""
    runs = gap_runs(GAP, (e for e in events if e["user"] == user), lambda e: int(e["event_time"]))
    return [(int(r[0]["event_time"]), int(r[-1]["event_time"]), float(int(r[-1]["event_time"]) - int(r[0]["event_time"])),
             {"count": len(r), "sum_seconds": sum(e["seconds"] for e in r), "min_seconds": min(e["seconds"] for e in r),
              "max_seconds": max(e["seconds"] for e in r)}) for r in runs]


def _epoch(text: str) -> int:
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp())


def _timeline(browser: Any) -> list[tuple[int, int, float, dict[str, Any]]]:
    """The key's timeline bars as the page carries them: (start, end, duration, measures)."""
    return [(_epoch(g.get_attribute("data-start")), _epoch(g.get_attribute("data-end")),
             float(g.get_attribute("data-duration")), json.loads(g.get_attribute("data-values")))
            for g in browser.find_elements("css selector", "#key svg[data-chart='sessions'] g.session")]


def _answered(body: dict[str, Any]) -> list[tuple[int, int, float, dict[str, Any]]]:
    return [(_epoch(x["session_start"]), _epoch(x["session_end"]), x["duration"], x["value"]) for x in body["sessions"]]


@pytest.mark.slow
def test_a_session_view_shows_its_top_keys_and_a_keys_sessions(
        browser: Any, spark: Any, make_settings: Callable[..., Settings], api: Callable[..., Any], tmp_path: Path,
        artifacts: Path) -> None:
    """A session view's page: its kind, the top keys by session count and by longest session as bar charts, and
    one key's sessions as a timeline (one bar per session, a marker for folded ones) over a table, equal to the
    API's answers and to a plain-Python sessionization of the events written here (30-minute gap)."""
    settings = make_settings(pipeline="tests.support.visits_pipeline")
    (artifacts / "console").mkdir(exist_ok=True)
    t0 = 1_709_280_000
    times = {"u0": (0, 600, 1200, 5000), "u1": (0, 1700), "u2": (0, 4000, 8000)}  # u0: 2 sessions, u1: 1, u2: 3
    events = [{"user": user, "page": "/", "seconds": 5 + t % 13, "event_time": str(t0 + t)}
              for user, ts in times.items() for t in ts]
    ingest_file(settings, events, tmp_path / "visits.jsonl")
    run_batch(spark, settings, load_pipeline(settings.pipeline), redis_url=settings.redis_url)
    with api(pipeline=settings.pipeline) as server, web.client(base_url=server.base_url, timeout=30) as client:
        console = f"{server.base_url}/console#/pipelines/visits/views"
        expected = {"count": [("u2", 3.0), ("u0", 2.0), ("u1", 1.0)], "longest": [("u1", 1700.0), ("u0", 1200.0),
                                                                               ("u2", 0.0)]}
        for by, bars in expected.items():
            load(browser, f"{console}/visits?by={by}&n=5", "view")
            assert field(browser, "window", "section.card") == "sessions, gap 30 m"
            shown = [(g.get_attribute("data-key"), float(g.get_attribute("data-value")))
                     for g in browser.find_elements("css selector", "#top svg[data-chart='top'] g[data-key]")]
            top = client.get("/v1/views/visits/sessions/top", params={"by": by, "n": 5}).json()
            assert shown == bars == [(e["key"], e["value"]) for e in top["top"]], (by, shown)

        # One key, all time: a bar per session, equal to the API's answer and to the sessions of the events.
        load(browser, f"{console}/visits?key=u0", "view")
        answer = client.get("/v1/views/visits/sessions/keys/u0").json()
        assert _timeline(browser) == _answered(answer) == _oracle_sessions(events, "u0")
        assert values(browser, "#key [data-field='session.duration']") == ["1200", "0"]  # the table, below it
        assert values(browser, "#key [data-field='session.count']") == ["3", "1"]
        assert int(field(browser, "key.version", "#key")) == answer["version"]
        assert not browser.find_elements("css selector", "#key svg[data-chart='sessions'] g.folded")
        browser.save_screenshot(str(artifacts / "console" / "view-sessions.png"))

        # A range: the axis is the range asked; the bars are the sessions overlapping it, whole.
        start, end = t0 + 3000, t0 + 9000
        load(browser, f"{console}/visits?key=u2&from={start}&to={end}", "view")
        ranged = client.get("/v1/views/visits/sessions/keys/u2", params={"from": start, "to": end}).json()
        want = [(a, b, d, m) for a, b, d, m in _oracle_sessions(events, "u2") if a < end and b >= start]
        assert _timeline(browser) == _answered(ranged) == want and len(want) == 2
        chart = browser.find_element("css selector", "#key svg[data-chart='sessions']")
        assert (_epoch(chart.get_attribute("data-from")), _epoch(chart.get_attribute("data-to"))) == (start, end)

        # The bounded view keeps KEEP sessions a user: the rest is a folded marker, the answer not exact.
        load(browser, f"{console}/visits_bounded?key=u2", "view")
        bounded = client.get("/v1/views/visits_bounded/sessions/keys/u2").json()
        sessions = _oracle_sessions(events, "u2")
        kept = [(a, b, d, {"count": m["count"]}) for a, b, d, m in sessions[-KEEP:]]
        assert _timeline(browser) == _answered(bounded) == kept and not bounded["exact"]
        (folded,) = browser.find_elements("css selector", "#key svg[data-chart='sessions'] g.folded")
        assert int(folded.get_attribute("data-folded")) == bounded["folded"]["sessions"] == len(sessions) - KEEP
        assert _epoch(folded.get_attribute("data-start")) == sessions[0][0] == t0
        browser.save_screenshot(str(artifacts / "console" / "view-sessions-folded.png"))
