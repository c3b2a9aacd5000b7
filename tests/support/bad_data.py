"""Checking the answers of ``tests.support.ratio_pipeline`` over HTTP against its plain-Python oracle.

Poison events left out, an overflowed sum answered ``"overflow"`` (JSON, and CSV export), never
ranked by top-N; every other value equal to the oracle's (sums within rounding).
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable
from typing import Any

import httpx

from tests.support import key_url
from tests.support.ratio_pipeline import VIEW, oracle

EVENT_TIME = "2026-01-01T00:00:00+00:00"


def readings(*rows: tuple[str, float, float]) -> list[dict[str, Any]]:
    """Events of ``(user_id, amount, divisor)``, at a fixed event time."""
    return [{"user_id": u, "amount": a, "divisor": d, "event_time": EVENT_TIME} for u, a, d in rows]


def _same(got: Any, want: Any) -> bool:
    if not isinstance(got, (int, float)) or not isinstance(want, (int, float)):
        return got == want
    return math.isclose(got, want, rel_tol=1e-12)


def _cell(text: str | None) -> Any:
    """A CSV cell as the answer's value: a number, '' (null) as None, other text as it is ('overflow')."""
    if not text:
        return None
    try:
        return float(text)
    except ValueError:
        return text


def answer_problems(client: httpx.Client, events: Iterable[dict[str, Any]], *, version: int | None = None,
                    absent: Iterable[str] = ()) -> list[str]:
    """How the answers differ from the oracle over ``events``: every user's key answer (at ``version`` or
    later), ``absent`` users (all their events poison) not found, the top-N by ``sum_amount`` (overflowed
    users not ranked) and the CSV export."""
    want = oracle(events)
    problems = []
    for user, measures in want.items():
        body = client.get(key_url(VIEW, user)).json()
        if version is not None and body.get("version", -1) < version:
            problems.append(f"{user}: version {body.get('version')} < {version}")
        problems += [f"{user} {name}: {body['value'].get(name)!r}, oracle {value!r}"
                     for name, value in measures.items() if not _same(body.get("value", {}).get(name), value)]
    problems += [f"{user}: {r.status_code}, not 404" for user in absent
                 if (r := client.get(key_url(VIEW, user))).status_code != 404]
    ranked = sorted(((u, m["sum_amount"]) for u, m in want.items() if m["sum_amount"] != "overflow"),
                    key=lambda kv: (-kv[1], kv[0]))
    top = client.get(f"/v1/views/{VIEW}/top", params={"measure": "sum_amount", "n": len(want)}).json()["top"]
    if [e["key"] for e in top] != [u for u, _ in ranked] or not all(_same(e["value"], v) for e, (_, v) in
                                                                       zip(top, ranked)):
        problems.append(f"top by sum_amount: {top}, oracle {ranked}")
    exported = client.get(f"/v1/views/{VIEW}/keys", headers={"Accept": "text/csv"})
    rows = {r["user_id"]: r for r in csv.DictReader(io.StringIO(exported.text))}
    for user, measures in want.items():
        cell = rows.get(user, {}).get("sum_amount")
        if not _same(_cell(cell), measures["sum_amount"]):
            problems.append(f"CSV {user} sum_amount: {cell!r}, oracle {measures['sum_amount']!r}")
    return problems
