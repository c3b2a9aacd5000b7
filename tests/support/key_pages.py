"""Paging a view's keys (``GET /v1/views/{view}/keys``) in tests, and comparing the listed rows with an oracle
keyed ``(encoded key, window start or None)`` (as ``tests.support.flights.oracle`` computes it)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import httpx


def page(client: httpx.Client, view: str, params: dict[str, Any], **headers: str) -> httpx.Response:
    return client.get(f"/v1/views/{view}/keys", params=params, headers=headers)


def every_page(client: httpx.Client, view: str, params: dict[str, Any], limit: int) -> list[dict[str, Any]]:
    bodies, cursor = [], None
    while True:
        response = page(client, view, {**params, "limit": limit, **({"cursor": cursor} if cursor else {})})
        assert response.status_code == 200, response.text
        body = response.json()
        assert len(body["keys"]) <= limit
        bodies.append(body)
        cursor = body["next_cursor"]
        if cursor is None:
            return bodies


def rows_of(bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [entry for body in bodies for entry in body["keys"]]


def as_oracle(entries: list[dict[str, Any]]) -> dict[tuple[str, int | None], dict[str, Any]]:
    def start(entry: dict[str, Any]) -> int | None:
        window = entry["window"]
        return None if window is None else int(datetime.fromisoformat(window["start"]).timestamp())

    return {(e["key"], start(e)): e["value"] for e in entries}


def check_values(got: dict[tuple[str, int | None], dict[str, Any]], want: dict[tuple[str, int | None], dict[str, int]]) -> None:
    assert set(got) == set(want), f"rows {sorted(set(got) ^ set(want))[:10]} differ"
    for row, value in want.items():
        assert got[row] == value and all(type(v) is int for v in got[row].values()), (row, got[row], value)
