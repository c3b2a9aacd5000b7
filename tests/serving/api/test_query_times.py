"""Times in queries: the two documented forms, exactly, and the supported range.

``window_start``, ``from`` and ``to`` take ISO 8601 or epoch seconds (at most 6 decimals), and
nothing else. Regressions:

* ``window_start=253402300740`` (epoch seconds of 9999-12-31T23:59:00Z) was read as milliseconds
  (1978); any epoch number above 2e10 was. Now always seconds: a key published in the year 3000
  is found by its window's epoch seconds, and the year-9999 hour by decimal seconds one
  microsecond before its end (exact: a float would round it into the next hour).
* ``1e20`` and ``nan`` answered "input is too short"; now a 422 naming the parameter and the forms.
* ``top?window_start=9999-12-31T23:59:00Z`` raised OverflowError (a 500): its window would end in
  the year 10000. Now a 422 naming the parameter and the times this view can address.

Refusals come before any read, so they are checked with nothing published (a valid query would
answer 503); the forms and the ends of the range are checked against a real batch run, with an
oracle that is the events themselves (one event per key).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from batch_layer.recompute.job import run_batch
from deploy.settings import Settings
from shared_logic.registry import load_pipeline
from tests.support import ingest_file, key_url, web

RANGE = "0001-01-01T00:00:00Z to 9999-12-31T23:59:59.999999Z"
HOURLY = "spend_by_user_hourly"


def refused(response: httpx.Response, *words: str) -> str:
    assert response.status_code == 422, response.text
    body = response.json()
    assert set(body) == {"error", "detail"}, body
    for word in words:
        assert word in body["detail"], body
    return body["detail"]


@pytest.mark.parametrize("value", ["1e20", "nan", "inf", "-inf", "0x10", "1_000", "+5", "1709283600.1234567",
                                   "2024-03-01", "yesterday", "", "2024-02-30T00:00:00Z"])
def test_malformed_times_are_422_naming_the_parameter_and_the_forms(value: str, api: Callable[..., Any]) -> None:
    with api(pipeline="payments") as server, web.client(base_url=server.base_url, timeout=10) as client:
        detail = refused(client.get(f"/v1/views/{HOURLY}/top", params={"window_start": value}), "'window_start'",
                         "epoch seconds", "ISO 8601")
        assert "too short" not in detail
        refused(client.get(key_url(HOURLY, "alice"), params={"from": value, "to": "2024-03-01T10:00:00Z"}),
                "'from'", "epoch seconds")


@pytest.mark.parametrize(("params", "name"), [
    ({"window_start": "9999-12-31T23:59:00Z"}, "window_start"),
    ({"window_start": "253402300740"}, "window_start"),
    ({"window_start": "1709283600000"}, "window_start"),  # milliseconds are read as seconds: year 56135
    ({"window_start": "0001-01-01T00:00:00+01:00"}, "window_start"),
    ({"window_start": "9999-12-31T23:59:59-01:00"}, "window_start"),
    ({"window_start": "-62135596801"}, "window_start"),
    ({"from": "9999-12-31T20:00:00Z", "to": "9999-12-31T23:59:59.999999Z"}, "to"),
    ({"from": "0001-01-01T00:30:00+01:00", "to": "0001-01-01T05:00:00Z"}, "from"),
])
def test_times_whose_window_leaves_the_range_are_422(params: dict[str, str], name: str, api: Callable[..., Any]) -> None:
    with api(pipeline="payments") as server, web.client(base_url=server.base_url, timeout=10) as client:
        refused(client.get(key_url(HOURLY, "alice"), params=params), name)
        if "window_start" in params:
            refused(client.get(f"/v1/views/{HOURLY}/top", params=params), name)


def test_the_window_limit_names_the_times_this_view_can_address(api: Callable[..., Any]) -> None:
    with api(pipeline="payments") as server, web.client(base_url=server.base_url, timeout=10) as client:
        detail = refused(client.get(f"/v1/views/{HOURLY}/top", params={"window_start": "9999-12-31T23:59:00Z"}),
                         "window_start", RANGE)
        assert "0001-01-01T00:00:00+00:00" in detail and "9999-12-31T22:59:59.999999+00:00" in detail


def test_a_top_n_of_more_key_panes_than_allowed_is_422_naming_n_the_panes_and_the_setting(
        api: Callable[..., Any]) -> None:
    """Its work grows with n x panes (each key ranked is looked up in every pane): bounded before any read."""
    range_ = {"from": "2024-03-01T00:00:00Z", "to": "2024-03-02T00:00:00Z"}  # 24 hourly panes
    with api(pipeline="payments", max_top_cells=100) as server, \
            web.client(base_url=server.base_url, timeout=10) as client:
        refused(client.get(f"/v1/views/{HOURLY}/top", params={**range_, "n": "5"}),
                "n=5", "24 panes", "LAMBDA_MAX_TOP_CELLS=100", "smaller n", "shorter range")
        assert client.get(f"/v1/views/{HOURLY}/top", params={**range_, "n": "4"}).status_code == 503  # none published


def test_a_listing_page_of_more_rows_x_panes_than_allowed_is_422_naming_limit_and_the_range(
        api: Callable[..., Any]) -> None:
    """A page reads each key over every pane: limit x panes is bounded (MAX_LIST_CELLS) before any read."""
    from serving.api.key_pages import MAX_LIST_CELLS

    hours = MAX_LIST_CELLS // 1000 + 1  # one more hourly pane than a page of 1000 rows may combine
    range_ = {"from": "2024-03-01T00:00:00Z", "to": f"{1709251200 + hours * 3600}"}
    with api(pipeline="payments") as server, web.client(base_url=server.base_url, timeout=10) as client:
        refused(client.get(f"/v1/views/{HOURLY}/keys", params={**range_, "limit": "1000"}),
                "limit=1000", f"{hours} panes", str(MAX_LIST_CELLS), "smaller limit", "shorter range")
        assert client.get(f"/v1/views/{HOURLY}/keys", params={**range_, "limit": "100"}).status_code == 503


@pytest.mark.parametrize(("params", "words"), [
    ({"to": "2024-03-01T09:00:00Z"}, ["to:", "from=<time>"]),  # `to` without `from`
    ({"from": "2024-03-01T10:00:00Z", "to": "2024-03-01T09:00:00Z"}, ["'to'", "after 'from'", "swap"]),
    ({"last": "3650000d"}, ["last:", "supported time range"]),
    ({"from": "yesterday-ish"}, ["'from'", "epoch seconds"]),
    ({"last": "1h", "from": "-2h"}, ["from and last"]),
])
def test_a_range_is_refused_alike_by_the_window_and_the_session_routes(params: dict[str, str], words: list[str],
                                                                       api: Callable[..., Any]) -> None:
    """A sliding view's key and a session view's key take ``from``/``to``/``last`` by one rule (``windows.resolve``):
    the same 422 before any read, and a range both accept (``to`` left out: now) answered alike (503: none
    published)."""
    with api(pipeline="tests.support.windows_pipeline") as server, \
            web.client(base_url=server.base_url, timeout=10) as client:
        routes = (key_url("plays_trending", "s1"), "/v1/views/listening/sessions/keys/l1",
                  "/v1/views/listening/sessions/summary/l1", "/v1/views/listening/sessions/top")
        details = {refused(client.get(route, params=params), *words) for route in routes}
        assert len(details) == 1, details
        for route in routes:
            assert client.get(route, params={"from": "-1h"}).status_code == 503, route


EVENTS = [
    {"user_id": "alice", "merchant": "m", "amount": 2.0, "event_time": "3000-01-01T00:30:00Z"},
    {"user_id": "bob", "merchant": "m", "amount": 3.0, "event_time": "9999-12-31T22:30:00Z"},
    {"user_id": "carol", "merchant": "m", "amount": 4.0, "event_time": "0001-01-01T00:10:00Z"},
    {"user_id": "dave", "merchant": "m", "amount": 5.0, "event_time": "9999-12-31T23:30:00Z"},
]


@pytest.mark.slow  # over 2.5 s in a full run: the full tier (the quick tier has a 3-minute budget)
def test_epoch_seconds_are_seconds_and_exact_at_the_ends_of_the_range(
    spark: Any, make_settings: Callable[..., Settings], redis_url: str, api: Callable[..., Any], tmp_path: Path
) -> None:
    settings = make_settings(pipeline="payments")
    ingest_file(settings, EVENTS, tmp_path / "events.jsonl")
    run_batch(spark, settings, load_pipeline("payments"), redis_url=redis_url)
    with api(pipeline="payments") as server, web.client(base_url=server.base_url, timeout=10) as client:
        def window(user: str, **params: str) -> tuple[str, str]:
            response = client.get(key_url(HOURLY, user), params=params)
            assert response.status_code == 200, (user, params, response.text)
            assert response.json()["value"]["count"] == 1
            w = response.json()["window"]
            return w["start"], w["end"]

        year3000 = 32503680000  # 3000-01-01T00:00:00Z
        for spelled in (str(year3000), f"{year3000 + 1800}.5", f"{year3000 + 3599}.999999",
                        "3000-01-01T01:29:59.999999+01:00"):
            assert window("alice", window_start=spelled) == ("3000-01-01T00:00:00Z", "3000-01-01T01:00:00Z"), spelled
        # one microsecond before the year 9999's last addressable hour ends: a float would read 23:00:00
        assert window("bob", window_start="253402297199.999999") == ("9999-12-31T22:00:00Z", "9999-12-31T23:00:00Z")
        assert window("carol", window_start="-62135596800") == ("0001-01-01T00:00:00Z", "0001-01-01T01:00:00Z")
        ranged = client.get(key_url(HOURLY, "carol"), params={"from": "-62135596800", "to": "0001-01-01T01:00:00Z"})
        assert ranged.status_code == 200 and ranged.json()["value"]["count"] == 1, ranged.text

        top = client.get(f"/v1/views/{HOURLY}/top", params={"window_start": "9999-12-31T22:00:00Z"})
        assert top.status_code == 200 and [e["key"] for e in top.json()["top"]] == ["bob"], top.text
        # dave's hour ends in the year 10000: counted all time, its window is out of reach
        assert client.get(key_url("spend_by_user", "dave")).json()["value"]["count"] == 1
        refused(client.get(key_url(HOURLY, "dave"), params={"window_start": "9999-12-31T23:30:00Z"}), "window_start")
