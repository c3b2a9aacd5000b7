"""``lambda-platform query | top`` against a real API after a real batch run, checked against the oracle.

Oracle: ``tests.oracle`` (plain Python over the master dataset's events at the barrier version).
The commands are run in-process (``deploy.cli.main.run``) with their output captured; ``--json`` must
carry the oracle's numbers, and the tables must show them.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

import pytest

from batch_layer.recompute.job import run_batch
from deploy.cli.main import run
from deploy.settings import Settings
from shared_logic.registry import load_pipeline
from tests import oracle
from tests.support import ingest_file
from tests.support.servers import ApiServer

START = datetime(2024, 3, 1, 9, 0, tzinfo=timezone.utc)


@pytest.fixture(scope="module")
def served(spark: Any, module_settings: Callable[..., Settings], tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Wordcount events recomputed once for the module and served over HTTP; yields (cli args prefix, port,
    oracle views, barrier). The module's tests only read."""
    from serving.api.app import create_app

    settings = module_settings(pipeline="wordcount")
    folder = tmp_path_factory.mktemp("view-commands")
    events = oracle.wordcount_events(random.Random(7), 200, START, seconds=600)
    ingest_file(settings, events, folder / "events.jsonl")
    run_batch(spark, settings, load_pipeline("wordcount"), redis_url=settings.redis_url)
    barrier = oracle.barrier_versions(settings.master_path)[-1]
    views = oracle.views("wordcount", oracle.read_events(settings.master_path, barrier))
    with ApiServer(create_app(settings, redis_url=settings.redis_url or "")) as server:
        yield ["--data-dir", str(folder / "cli"), "--pipeline", "wordcount"], server.port, views, barrier


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = run(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_query_json_and_table_equal_the_oracle(served: Any, capsys: pytest.CaptureFixture[str]) -> None:
    prefix, port, views, barrier = served
    counts = {key: m["count"] for (key, _), m in views["word_counts"].items()}
    word = sorted(counts)[0]
    code, out, err = _cli(capsys, *prefix, "query", "word_counts", word, "--json", "--port", str(port))
    assert code == 0, err
    answer = json.loads(out)
    assert answer["value"]["count"] == counts[word] and answer["version"] == barrier

    code, out, err = _cli(capsys, *prefix, "query", "word_counts", word, "--explain", "--port", str(port))
    assert code == 0, err
    assert "batch" in out and "realtime" in out and f"{counts[word]:,}" in out and f"version {barrier}" in out


def test_query_range_lists_each_window(served: Any, capsys: pytest.CaptureFixture[str]) -> None:
    prefix, port, views, _ = served
    per_minute = views["word_counts_per_minute"]
    first = int(START.timestamp())  # the generator adds a few edge-case times far away: stay in the hour
    in_hour = [(key, ws) for key, ws in per_minute if first <= ws < first + 3600]
    word = max(sorted({key for key, _ in in_hour}), key=lambda k: sum(1 for key, _ in in_hour if key == k))
    windows = sorted(ws for key, ws in in_hour if key == word)
    code, out, err = _cli(capsys, *prefix, "query", "word_counts_per_minute", word, "--from", str(windows[0]),
                          "--to", str(windows[-1] + 60), "--json", "--port", str(port))
    assert code == 0, err
    answer = json.loads(out)
    assert answer["value"]["count"] == sum(per_minute[(word, ws)]["count"] for ws in windows)
    assert [w["value"]["count"] for w in answer["windows"]] == [per_minute[(word, ws)]["count"] for ws in windows]


def test_top_equals_the_oracle_ranking(served: Any, capsys: pytest.CaptureFixture[str]) -> None:
    prefix, port, views, _ = served
    ranking = sorted(((m["count"], key) for (key, _), m in views["word_counts"].items()), key=lambda t: (-t[0], t[1]))
    code, out, err = _cli(capsys, *prefix, "top", "word_counts", "-n", "5", "--json", "--port", str(port))
    assert code == 0, err
    assert [(e["value"], e["key"]) for e in json.loads(out)["top"]] == ranking[:5]

    code, out, err = _cli(capsys, *prefix, "top", "word_counts", "-n", "5", "--port", str(port))
    assert code == 0, err
    assert all(key in out for _, key in ranking[:5])


def test_errors_name_what_the_api_said(served: Any, capsys: pytest.CaptureFixture[str]) -> None:
    prefix, port, _, _ = served
    code, _, err = _cli(capsys, *prefix, "query", "no_such_view", "k", "--port", str(port))
    assert code == 1 and "404" in err and "no_such_view" in err and "word_counts" in err
    code, _, err = _cli(capsys, *prefix, "top", "word_counts", "-n", "0", "--port", str(port))
    assert code == 1 and "422" in err and "n" in err
    code, _, err = _cli(capsys, *prefix, "query", "word_counts", "x", "--port", "1")
    assert code == 1 and "not reachable" in err and "127.0.0.1:1" in err


def test_keys_pages_through_every_key_once(served: Any, capsys: pytest.CaptureFixture[str]) -> None:
    prefix, port, views, _ = served
    counts = {key: m["count"] for (key, _), m in views["word_counts"].items()}
    code, out, err = _cli(capsys, *prefix, "keys", "word_counts", "--limit", "7", "--all", "--json", "--port", str(port))
    assert code == 0, err
    pages, decoder, at = [], json.JSONDecoder(), 0
    while at < len(out.strip()):
        page, at = decoder.raw_decode(out, at)
        pages.append(page)
        while at < len(out) and out[at].isspace():
            at += 1
    assert len(pages) == -(-len(counts) // 7)
    listed = [(entry["key"], entry["value"]["count"]) for page in pages for entry in page["keys"]]
    assert listed == sorted(counts.items(), key=lambda kv: kv[0].encode())

    first = sorted(counts, key=str.encode)[0]
    code, out, err = _cli(capsys, *prefix, "keys", "word_counts", "--prefix", first, "--port", str(port))
    assert code == 0, err
    assert first in out and f"{counts[first]:,}" in out
    code, _, err = _cli(capsys, *prefix, "keys", "word_counts", "--where", "nonsense", "--port", str(port))
    assert code == 2 and "COLUMN=VALUE" in err


@pytest.mark.slow
def test_session_views_take_the_same_queries(spark: Any, make_settings: Callable[..., Settings], tmp_path: Any,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """``query --sessions | --summary`` and ``top --by`` on a session view answer what the API does; the sessions are
    worked out by hand here (30-minute gap): u0 [0, 1200] of 3 events and [5000] alone, u1 [0, 1700] of 2."""
    from serving.api.app import create_app

    settings = make_settings(pipeline="tests.support.visits_pipeline")
    t0 = int(START.timestamp())
    events = [{"user": user, "page": "/", "seconds": 5, "event_time": str(t0 + t)}
              for user, t in (("u0", 0), ("u0", 600), ("u0", 1200), ("u0", 5000), ("u1", 0), ("u1", 1700))]
    ingest_file(settings, events, tmp_path / "visits.jsonl")
    run_batch(spark, settings, load_pipeline(settings.pipeline), redis_url=settings.redis_url)
    with ApiServer(create_app(settings, redis_url=settings.redis_url or "")) as server:
        prefix, port = ["--data-dir", str(tmp_path / "cli"), "--pipeline", settings.pipeline], str(server.port)
        code, out, err = _cli(capsys, *prefix, "query", "visits", "u0", "--sessions", "--json", "--port", port)
        assert code == 0, err
        assert [(s["duration"], s["value"]["count"]) for s in json.loads(out)["sessions"]] == [(1200.0, 3), (0.0, 1)]
        code, out, err = _cli(capsys, *prefix, "query", "visits", "u0", "--sessions", "--from", str(t0 + 3000),
                              "--port", port)
        assert code == 0 and "exact as of master version" in out and "5,000" not in out, err
        code, out, err = _cli(capsys, *prefix, "query", "visits", "u0", "--summary", "--json", "--port", port)
        summary = json.loads(out)
        assert (summary["sessions"], summary["total_duration"], summary["mean_duration"]) == (2, 1200.0, 600.0)
        code, out, err = _cli(capsys, *prefix, "top", "visits", "--by", "longest", "--json", "--port", port)
        assert [(e["key"], e["value"]) for e in json.loads(out)["top"]] == [("u1", 1700.0), ("u0", 1200.0)]
        code, out, err = _cli(capsys, *prefix, "top", "visits", "--by", "count", "--port", port)
        assert code == 0 and out.index("u0") < out.index("u1"), out
        code, out, err = _cli(capsys, *prefix, "query", "visits", "u0", "--port", port)
        assert code != 0 and "session view" in err, err
        code, out, err = _cli(capsys, *prefix, "query", "visits", "u0", "--sessions", "--last", "1h", "--json", "--port", port)
        answer = json.loads(out)  # the last hour of the real clock: none of these 2024 sessions
        assert answer["sessions"] == [] and answer["exact"] and answer["now"] and answer["range"], answer
    small = settings.model_copy(update={"max_session_top_keys": 1})  # u0's and u1's rows are more than one
    with ApiServer(create_app(small, redis_url=settings.redis_url or "")) as server:
        code, out, err = _cli(capsys, *prefix, "top", "visits", "--by", "count", "--port", str(server.port))
        assert code != 0 and "LAMBDA_MAX_SESSION_TOP_KEYS" in err, err
