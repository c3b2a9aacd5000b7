"""A cursor is read only as this route writes it: anything else is a 422.

``GET /v1/views/{view}/keys?cursor=...`` accepted a ``next_cursor`` whose generation was ``999999``,
``-1`` or ``"x"``, one with an extra field, or one whose key part was not base64 (its characters
were dropped), and read it as a position (often the start). The README says an unreadable cursor
is a 422: now every field is checked (type and value), the key must be base64 of UTF-8, and a
generation after the served one is refused (generations only move forward, so no page was read
there). A genuine cursor still pages on (the oracle: every key of the events sent, in bytewise
order), and one made before cursors recorded their logic (no ``l``) is still answered 409.
"""

from __future__ import annotations

import base64
import json
import random
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import httpx
import pytest

from batch_layer.recompute.job import run_batch
from deploy.settings import Settings
from serving.api.key_pages import MAX_CURSOR_CHARS
from shared_logic.registry import load_pipeline
from tests.support import ingest_file, web

PIPELINE = "tests.support.flights_pipeline"
VIEW = "flights_by_route"
START = datetime(2024, 3, 1, 9, 0, tzinfo=timezone.utc)
AIRPORTS = ["JFK", "LAX", "SFO", "ORD", "Ünï"]


def body_of(cursor: str) -> dict[str, Any]:
    return json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))


def cursor_of(body: Any, *, raw: bytes | None = None) -> str:
    text = raw if raw is not None else json.dumps(body, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(text).decode().rstrip("=")


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode()


def forgeries(real: str) -> dict[str, str]:
    """Cursors this route never makes, each from the real one with one thing changed."""
    body = body_of(real)

    def changed(**fields: Any) -> str:
        return cursor_of({**body, **fields})

    without_key = {k: v for k, v in body.items() if k != "k"}
    return {
        "generation 999999": changed(g=999999),
        "generation -1": changed(g=-1),
        "generation 'x'": changed(g="x"),
        "generation null": changed(g=None),
        "generation true": changed(g=True),
        "generation 1.0": changed(g=float(body["g"])),
        "an extra field": changed(extra=1),
        "no key field": cursor_of(without_key),
        "key part not base64": changed(k="!!not base64!!"),
        "key part not UTF-8": changed(k=b64(b"\xff\xfe")),
        "key part a number": changed(k=5),
        "kind -1 (never made)": changed(t=-1),
        "kind true": changed(t=True),
        "kind 1 with a key": changed(t=1, k=b64(b"JFK")),
        "window 'x'": changed(w="x"),
        "fingerprint 5": changed(f=5),
        "logic 5": changed(l=5),
        "a list": cursor_of([body]),
        "JSON nested 5000 deep": cursor_of(None, raw=b"[" * 5_000 + b"]" * 5_000),
        "not JSON": cursor_of(None, raw=b"\xff{}"),
        "characters outside base64": real[:10] + "*" + real[10:],
        "padding inside": real[:8] + "=" + real[8:],
    }


#: Forgeries with characters a cursor never holds: the route's declared pattern refuses them.
OUTSIDE_THE_ALPHABET = {"characters outside base64", "padding inside"}


@pytest.fixture
def served(spark: Any, make_settings: Callable[..., Settings], tmp_path: Path) -> tuple[Settings, list[str]]:
    """A published generation of flights; the oracle: every route key of the events, bytewise sorted."""
    settings = make_settings(pipeline=PIPELINE)
    rng = random.Random(11)
    events = [{"origin": rng.choice(AIRPORTS), "dest": rng.choice(AIRPORTS), "delay": rng.randint(0, 60),
               "event_time": (START + timedelta(minutes=rng.randrange(300))).isoformat()} for _ in range(80)]
    ingest_file(settings, events, tmp_path / "flights.jsonl")
    run_batch(spark, settings, load_pipeline(PIPELINE), redis_url=settings.redis_url)
    keys = sorted({f"{e['origin']}|{e['dest']}" for e in events}, key=str.encode)
    return settings, keys


def pages(client: httpx.Client, cursor: str | None, limit: int) -> list[str]:
    keys: list[str] = []
    while True:
        params: dict[str, Any] = {"limit": limit, **({"cursor": cursor} if cursor else {})}
        response = client.get(f"/v1/views/{VIEW}/keys", params=params)
        assert response.status_code == 200, response.text
        keys += [entry["key"] for entry in response.json()["keys"]]
        cursor = response.json()["next_cursor"]
        if cursor is None:
            return keys


@pytest.mark.slow  # over 2.5 s in a full run: the full tier (the quick tier has a 3-minute budget)
def test_every_cursor_this_route_does_not_make_is_a_422(served: tuple[Settings, list[str]],
                                                        api: Callable[..., Any]) -> None:
    _, oracle = served
    with api(pipeline=PIPELINE) as server, web.client(base_url=server.base_url, timeout=30) as client:
        first = client.get(f"/v1/views/{VIEW}/keys", params={"limit": 3}).json()
        real = first["next_cursor"]
        assert real and body_of(real)["g"] == first["generation"]
        for name, forged in forgeries(real).items():
            for accept in ("application/json", "application/x-ndjson"):
                response = client.get(f"/v1/views/{VIEW}/keys", params={"cursor": forged},
                                      headers={"Accept": accept})
                assert response.status_code == 422, (name, accept, response.status_code, response.text[:300])
                body = response.json()
                assert set(body) == {"error", "detail"}, (name, body)
                if name in OUTSIDE_THE_ALPHABET:  # refused by the pattern the document declares
                    assert body["detail"].startswith("query parameter 'cursor'") and "pattern" in body["detail"]
                else:
                    assert body["detail"].startswith("cursor:"), (name, body)
                    assert "next_cursor of the previous page" in body["detail"], (name, body)

        # the real cursor pages on; one made before cursors recorded their logic (no "l") is readable, and
        # answered as before: 409, start over (its rows may be of other logic)
        assert [e["key"] for e in first["keys"]] + pages(client, real, 4) == oracle
        old_style = cursor_of({k: v for k, v in body_of(real).items() if k != "l"})
        response = client.get(f"/v1/views/{VIEW}/keys", params={"cursor": old_style})
        assert response.status_code == 409 and "start over" in response.json()["detail"], response.text


@pytest.mark.slow  # over 2.5 s in a full run: the full tier (the quick tier has a 3-minute budget)
def test_a_cursor_longer_than_the_limit_is_a_422_naming_it(served: tuple[Settings, list[str]],
                                                           api: Callable[..., Any]) -> None:
    with api(pipeline=PIPELINE) as server, web.client(base_url=server.base_url, timeout=30) as client:
        response = client.get(f"/v1/views/{VIEW}/keys", params={"cursor": "A" * (MAX_CURSOR_CHARS + 1)})
        assert response.status_code == 422, response.text[:300]
        detail = response.json()["detail"]
        assert "'cursor'" in detail and str(MAX_CURSOR_CHARS) in detail and len(detail) < 400, detail
        spec = client.get("/openapi.json").json()["paths"]["/v1/views/{view}/keys"]["get"]["parameters"]
        (declared,) = [branch for branch in next(p for p in spec if p["name"] == "cursor")["schema"]["anyOf"]
                       if branch.get("type") == "string"]
        assert declared["maxLength"] == MAX_CURSOR_CHARS and declared["pattern"] == "^[A-Za-z0-9_-]*$", declared
