"""After the faults: wait until the platform has settled, then compare every served row with the oracle.

Settled: readyz answers 200 and a key answer states a version at least the newest acknowledged
(every acknowledged event is then in what is served, since answers are exact as of their
version). Then every (key, window) row of every view the oracle computed from the master table is
asked for over HTTP and must equal it, as must the top-N of ``word_counts`` and of each window of
``word_counts_per_minute`` (n = 1000: every key, so a key served but not in the master shows too).
A 503 or an answer older than the acknowledged version is retried until ``timeout``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import quote

import httpx

from tests import oracle
from tests.chaos import report
from tests.chaos.report import Findings

TOP_N = 1000
_WORKERS = 4


def wait_settled(http: httpx.Client, version: int | None, timeout: float, tick: Callable[[], None]) -> bool:
    """True once readyz is 200 and a key answer states ``version`` or newer; ``tick`` runs between polls."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        tick()
        try:
            if http.get("/readyz").status_code == 200:
                answer = http.get("/v1/views/word_counts/keys/the")
                if answer.status_code == 200 and (version is None or answer.json()["version"] >= version):
                    return True
        except (httpx.TransportError, ValueError):
            pass
        time.sleep(1.0)
    return False


def _fetch(http: httpx.Client, path: str, params: dict[str, Any], version: int | None,
           deadline: float) -> tuple[int, Any]:
    """(status, body) of the first answer that is not 503 and not older than ``version``, or the last one."""
    last: tuple[int, Any] = (0, "unreachable")
    while True:
        try:
            response = http.get(path, params=params)
            body = response.json()
            last = (response.status_code, body)
            if response.status_code == 200 and (version is None or body["version"] >= version):
                return last
            if response.status_code not in (200, 503):
                return last
        except (httpx.TransportError, ValueError) as e:
            last = (0, f"{type(e).__name__}: {e}")
        if time.monotonic() > deadline:
            return last
        time.sleep(0.5)


def compare_served(http: httpx.Client, views: dict[str, oracle.ViewTable], version: int | None,
                   findings: Findings, timeout: float) -> int:
    """Every row and top-N of ``views`` over HTTP against the oracle; returns how many rows were compared."""
    deadline = time.monotonic() + timeout

    def row(view: str, key: str, window: int | None, want: dict[str, Any]) -> None:
        params = {} if window is None else {"window_start": window}
        status, body = _fetch(http, f"/v1/views/{view}/keys/{quote(key, safe='')}", params, version, deadline)
        got = body["value"]["count"] if status == 200 else None
        if got != want["count"] or (status == 200 and version is not None and body["version"] < version):
            findings.violation(report.SERVED_DIFFERS,
                               f"{view} {key!r} window {window}: served {got} ({status}, "
                               f"{body.get('version') if isinstance(body, dict) else body}), oracle {want['count']}")

    def top(view: str, window: int | None, rows: dict[str, int]) -> None:
        params: dict[str, Any] = {"n": TOP_N, **({} if window is None else {"window_start": window})}
        status, body = _fetch(http, f"/v1/views/{view}/top", params, version, deadline)
        want = sorted(rows.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_N]
        got = [(e["key"], e["value"]) for e in body["top"]] if status == 200 else None
        if got != want:
            diff = "no answer" if got is None else f"{len(set(got) ^ set(want))} entries differ"
            findings.violation(report.TOP_DIFFERS, f"{view} window {window}: {diff} ({status})")

    jobs = []
    for view, table in views.items():
        by_window: dict[int | None, dict[str, int]] = {}
        for (key, window), measures in table.items():
            jobs.append((row, (view, key, window, measures)))
            by_window.setdefault(window, {})[key] = measures["count"]
        jobs += [(top, (view, window, rows)) for window, rows in by_window.items()]
    with ThreadPoolExecutor(_WORKERS) as pool:
        for future in [pool.submit(fn, *args) for fn, args in jobs]:
            future.result()
    return sum(len(t) for t in views.values())
