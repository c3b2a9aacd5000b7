"""The scopes, decided once, over the app ``serving.api.app.create_app`` really builds.

``read``: the views and reading batch runs (``GET /v1/batch/runs``, ``GET /v1/batch/runs/{id}``);
``ingest``: ``POST /v1/events``; ``admin``: ``POST /v1/batch/runs``; open: probes, metrics, docs.
A read-only key once got 403 listing batch runs: the batch router was included behind ``admin``
and its GET routes added ``read`` on top. Every route class is called with every key (one per
scope, all scopes, an unknown key, none), off loopback (keys needed for reads too) and on
loopback (reads open): a request is refused exactly when its key lacks the route's scope (403)
or is absent or unknown (401), and otherwise reaches the handler (whatever it answers then).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.support import web

KEYS = {"k-read-51c0-0123456": ["read"], "k-ingest-9e2d-0123456": ["ingest"], "k-admin-07aa-0123456": ["admin"],
        "k-all-c3f1-0123456": ["read", "ingest", "admin"]}
BY_SCOPE = {"read": "k-read-51c0-0123456", "ingest": "k-ingest-9e2d-0123456", "admin": "k-admin-07aa-0123456", "all": "k-all-c3f1-0123456",
            "unknown": "k-nobody-4b8e-0123456", "none": None}
EVENT = {"user_id": "u", "merchant": "m", "amount": 1.0, "event_time": "2024-03-01T09:00:00Z"}

#: (route class, scope it needs or None, request)
ROUTES: list[tuple[str, str | None, tuple[str, str, dict[str, Any]]]] = [
    ("list views", "read", ("GET", "/v1/views", {})),
    ("key", "read", ("GET", "/v1/views/spend_by_user/keys/alice", {})),
    ("top", "read", ("GET", "/v1/views/spend_by_user/top", {})),
    ("session key", "read", ("GET", "/v1/views/spend_by_user/sessions/keys/alice", {})),
    ("session summary", "read", ("GET", "/v1/views/spend_by_user/sessions/summary/alice", {})),
    ("session top", "read", ("GET", "/v1/views/spend_by_user/sessions/top", {})),
    ("list runs", "read", ("GET", "/v1/batch/runs", {})),
    ("one run", "read", ("GET", "/v1/batch/runs/no-such-run", {})),
    ("start run", "admin", ("POST", "/v1/batch/runs", {})),
    ("ingest", "ingest", ("POST", "/v1/events", {"json": EVENT})),
    ("healthz", None, ("GET", "/healthz", {})),
    ("readyz", None, ("GET", "/readyz", {})),
    ("metrics", None, ("GET", "/metrics", {})),
    ("openapi", None, ("GET", "/openapi.json", {})),
    ("docs", None, ("GET", "/docs", {})),
    ("docs asset", None, ("GET", "/docs/assets/swagger-ui.css", {})),
]


def expected(needs: str | None, holder: str, loopback: bool) -> int | None:
    """401 or 403 when the request must be refused, None when it must reach its handler."""
    if needs is None or (needs == "read" and loopback):
        return None
    if holder in ("unknown", "none"):
        return 401
    return None if holder == "all" or holder == needs else 403


@pytest.mark.parametrize("host", ["0.0.0.0", "127.0.0.1"], ids=["non-loopback", "loopback"])
def test_every_route_class_with_every_scope(host: str, api: Callable[..., Any]) -> None:
    problems = []
    with api(pipeline="payments", api_keys=KEYS, http_host=host) as server, \
            web.client(base_url=server.base_url, timeout=30) as client:
        for holder, key in BY_SCOPE.items():
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            for name, needs, (method, url, extra) in ROUTES:
                response = client.request(method, url, headers=headers, **extra)
                want = expected(needs, holder, host == "127.0.0.1")
                got = response.status_code
                if want is None and got in (401, 403) or want is not None and got != want:
                    problems.append(f"{name} with the {holder} key: {got}, expected {want or 'not 401/403'}: "
                                    f"{response.text[:120]}")
                elif want == 403:
                    assert f"'{needs}'" in response.json()["detail"], response.text
    assert not problems, "\n".join(problems)


def test_a_read_only_key_lists_batch_runs(api: Callable[..., Any]) -> None:
    with api(pipeline="payments", api_keys=KEYS, http_host="0.0.0.0") as server, \
            web.client(base_url=server.base_url, timeout=30) as client:
        read = {"Authorization": f"Bearer {BY_SCOPE['read']}"}
        listed = client.get("/v1/batch/runs", headers=read)
        assert listed.status_code == 200 and listed.json()["runs"] == [], listed.text
        started = client.post("/v1/batch/runs", headers={"Authorization": f"Bearer {BY_SCOPE['admin']}"})
        assert started.status_code == 202, started.text
        run = client.get(started.headers["location"], headers=read)
        assert run.status_code == 200 and run.json()["status"] == "queued", run.text
        assert client.post("/v1/batch/runs", headers=read).status_code == 403
