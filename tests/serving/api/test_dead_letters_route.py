"""GET /v1/dead-letters over HTTP (real uvicorn, Redis, Delta tables) and the dead-letter counter in /metrics.

The letters come from real ingests with dead letters of files the test writes; the oracle is the test's own
list of its bad lines (line number, merchant, what is wrong), never the code's reading. Paging is checked by
walking every page and comparing with the whole list; filters against the lines the test knows match.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from batch_layer.master.backfill import backfill
from batch_layer.master.dataset import MasterDataset
from batch_layer.master.dead_letter_replay import replay
from batch_layer.master.dead_letters import SOURCES, DeadLetters
from deploy.settings import Settings
from serving.api.routes.dead_letters import MAX_LIMIT, Source
from shared_logic.pipeline import EventModel
from shared_logic.pipelines.payments import Payments
from shared_logic.registry import load_pipeline
from tests.support import web
from tests.support.metrics import scrape, value


class ColourPayment(EventModel):
    user_id: str
    merchant: str
    amount: float
    event_time: datetime | None = None
    colour: str | None = None


class ColourPayments(Payments):
    event_model = ColourPayment


def _write(file: Path, n: int) -> dict[int, tuple[str, str]]:
    """A JSON Lines file of ``n`` lines, every third one bad in one of three ways; its bad lines as
    line -> (merchant, what is wrong: 'amount', 'colour' or 'json')."""
    lines, bad = [], {}
    for i in range(1, n + 1):
        merchant = f"{file.stem}-{i}"
        event: dict[str, Any] = {"user_id": f"u{i % 4}", "merchant": merchant, "amount": i}
        kind = ("amount", "colour", "json")[(i // 3) % 3] if i % 3 == 0 else None
        if kind == "amount":
            event["amount"] = "many"
        elif kind == "colour":
            event["colour"] = "blue"
        text = json.dumps(event)
        lines.append(text[:-1] if kind == "json" else text)
        if kind:
            bad[i] = (merchant, kind)
    file.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return bad


def _all(client: httpx.Client, path: str = "/v1/dead-letters", **params: Any) -> dict[str, Any]:
    answer = client.get(path, params={"limit": MAX_LIMIT, **params})
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_listing_pages_filters_and_replayed_flags(make_settings: Callable[..., Settings], api: Callable[..., Any],
                                                  tmp_path: Path) -> None:
    settings = make_settings(pipeline="payments")
    master = MasterDataset.open(settings, load_pipeline("payments"))
    letters = DeadLetters.open(settings, "payments")
    one = _write(tmp_path / "one.jsonl", 45)
    master.ingest_file(tmp_path / "one.jsonl", dead_letters=letters)
    many = _write(tmp_path / "many.jsonl", 12)
    backfill(master, [tmp_path], dead_letters=letters)  # a folder (many.jsonl, one.jsonl): source backfill
    expected = {("file", "one.jsonl", n) for n in one} | {("backfill", "many.jsonl", n) for n in many} \
        | {("backfill", "one.jsonl", n) for n in one}

    with api(pipeline="payments") as server, web.client(base_url=server.base_url, timeout=10) as client:
        whole = _all(client)
        listed = whole["letters"]
        assert whole["total"] == len(listed) == len(expected) and whole["pipeline"] == "payments"
        assert {(r["source"], Path(r["file"]).name, r["line"]) for r in listed} == expected
        assert [r["dead_at"] for r in listed] == sorted(r["dead_at"] for r in listed)  # oldest first
        for r in listed:
            merchant, kind = (one if Path(r["file"]).name == "one.jsonl" else many)[r["line"]]
            assert merchant in r["raw"] and r["field"] == {"amount": "amount", "colour": "colour", "json": "(event)"}[kind]
            assert r["replayed"] is False

        pages, offset = [], 0
        while True:
            page = client.get("/v1/dead-letters", params={"offset": offset, "limit": 7}).json()
            assert page["total"] == len(listed) and page["offset"] == offset and len(page["letters"]) <= 7
            if not page["letters"]:
                break
            pages += page["letters"]
            offset += 7
        assert [r["id"] for r in pages] == [r["id"] for r in listed]
        newest = _all(client, order="newest")["letters"]
        assert [r["dead_at"] for r in newest] == sorted((r["dead_at"] for r in listed), reverse=True)

        backfilled = _all(client, source="backfill")
        assert {(r["source"], r["line"]) for r in backfilled["letters"]} == {(s, n) for s, _, n in expected if s == "backfill"}
        colour = _all(client, reason="EXTRA INPUTS")  # any case
        wanted = {(s, f, n) for s, f, n in expected if (one if f == "one.jsonl" else many)[n][1] == "colour"}
        assert colour["total"] == len(wanted) and {(r["source"], Path(r["file"]).name, r["line"])
                                                   for r in colour["letters"]} == wanted
        both = _all(client, source="file", reason="valid number")
        assert {r["line"] for r in both["letters"]} == {n for n, (_, kind) in one.items() if kind == "amount"}
        assert _all(client, "/v1/pipelines/payments/dead-letters")["total"] == len(listed)  # the pipeline's prefix

        fixed = MasterDataset(master.path, ColourPayments(), master.engine)
        done = replay(fixed, letters.select(reason="extra inputs"))
        assert len(done.replayed) == len(wanted)
        flags = {r["id"]: r["replayed"] for r in _all(client)["letters"]}
        assert {i for i, flag in flags.items() if flag} == set(done.replayed)


def test_bad_parameters_and_an_unknown_pipeline_get_a_clear_4xx(make_settings: Callable[..., Settings],
                                                                api: Callable[..., Any]) -> None:
    make_settings(pipeline="payments")
    with api(pipeline="payments") as server, web.client(base_url=server.base_url, timeout=10) as client:
        assert _all(client)["total"] == 0  # no table yet: an empty list
        for params, parameter in (({"offset": -1}, "offset"), ({"limit": 0}, "limit"), ({"limit": 10**6}, "limit"),
                                  ({"source": "nope"}, "source"), ({"reason": ""}, "reason"),
                                  ({"reason": "x" * 201}, "reason"), ({"order": "random"}, "order"),
                                  ({"offset": "ten"}, "offset")):
            answer = client.get("/v1/dead-letters", params=params)
            assert answer.status_code == 422, (params, answer.text)
            body = answer.json()
            assert body["error"] == "RequestValidationError" and f"query parameter {parameter!r}" in body["detail"]
        unknown = client.get("/v1/pipelines/nope/dead-letters")
        assert unknown.status_code == 404 and "'nope'" in unknown.json()["detail"]
        assert "payments" in unknown.json()["detail"]
        operation = client.get("/openapi.json").json()["paths"]["/v1/dead-letters"]["get"]
        assert {"200", "401", "403", "404", "422", "503"} <= set(operation["responses"])


def test_keys_are_needed_off_loopback(make_settings: Callable[..., Settings], api: Callable[..., Any]) -> None:
    keys = {"reader-key-000001": ["read"]}
    with api(pipeline="payments", api_keys=keys, http_host="0.0.0.0") as server, \
            web.client(base_url=server.base_url, timeout=10) as client:
        assert client.get("/v1/dead-letters").status_code == 401
        answer = client.get("/v1/dead-letters", headers={"Authorization": "Bearer reader-key-000001"})
        assert answer.status_code == 200 and answer.json()["total"] == 0


def test_metrics_count_dead_letters_per_source(make_settings: Callable[..., Settings], api: Callable[..., Any],
                                               tmp_path: Path) -> None:
    settings = make_settings(pipeline="payments")
    master = MasterDataset.open(settings, load_pipeline("payments"))
    letters = DeadLetters.open(settings, "payments")
    bad = _write(tmp_path / "one.jsonl", 30)
    with api(pipeline="payments") as server, web.client(base_url=server.base_url, timeout=10) as client:
        assert value(scrape(client), "lambda_dead_letters_total", pipeline="payments", source="file") is None
        master.ingest_file(tmp_path / "one.jsonl", dead_letters=letters)
        found = scrape(client)
        assert value(found, "lambda_dead_letters_total", pipeline="payments", source="file") == len(bad)
        more = _write(tmp_path / "two.jsonl", 9)
        backfill(master, [tmp_path / "two.jsonl", tmp_path / "one.jsonl"], dead_letters=letters)
        found = scrape(client)  # counted again after the table's new version
        assert value(found, "lambda_dead_letters_total", pipeline="payments", source="file") == len(bad)
        assert value(found, "lambda_dead_letters_total", pipeline="payments", source="backfill") == len(bad) + len(more)
        again = scrape(client)  # nothing new: the same counts (read from the cache of the table's version)
        assert value(again, "lambda_dead_letters_total", pipeline="payments", source="backfill") == len(bad) + len(more)


def test_the_route_lists_every_source_the_table_knows() -> None:
    from typing import get_args

    assert set(get_args(Source)) == set(SOURCES)


def test_the_console_lists_the_newest_dead_letters(make_settings: Callable[..., Settings], api: Callable[..., Any],
                                                   browser: Any, tmp_path: Path) -> None:
    from tests.support.browser import field, load, values

    settings = make_settings(pipeline="payments")
    master = MasterDataset.open(settings, load_pipeline("payments"))
    bad = _write(tmp_path / "one.jsonl", 12)
    master.ingest_file(tmp_path / "one.jsonl", dead_letters=DeadLetters.open(settings, "payments"))
    with api(pipeline="payments") as server, web.client(base_url=server.base_url, timeout=10) as client:
        load(browser, f"{server.base_url}/console#/pipelines/payments/dead-letters", "dead-letters")
        newest = _all(client, order="newest")["letters"]
        assert int(field(browser, "dead_letters.total")) == len(bad) == len(newest)
        assert values(browser, "tr[data-letter-id]", "data-letter-id") == [r["id"] for r in newest]
        shown = browser.find_element("css selector", "#dead-letters").text
        assert all(f"one.jsonl:{n}" in shown for n in bad) and "Extra inputs are not permitted" in shown
