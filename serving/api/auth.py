"""API keys with scopes: ``read``, ``ingest``, ``admin``.

Keys come from ``settings.api_keys`` (``LAMBDA_API_KEYS``, JSON ``{"key": ["read", ...]}``) and are
sent as ``Authorization: Bearer <key>``. ``require(scope)`` is the FastAPI dependency a router (or
a route) is included with. The scopes, decided once for every route:

* ``read``: ``GET /v1/views...`` (views, keys, top-N) and ``GET /v1/batch/runs``,
  ``GET /v1/batch/runs/{run_id}`` (reading batch runs is reading);
* ``ingest``: ``POST /v1/events``;
* ``admin``: ``POST /v1/batch/runs`` (starting a recompute);
* none: ``/healthz``, ``/readyz``, ``/metrics``, ``/docs`` (and its assets), ``/openapi.json``.

When each scope is asked for:

* ``ingest`` and ``admin`` are always required;
* ``read`` is required only when the server binds to a non-loopback address (``settings.http_host``
  outside 127.0.0.0/8, ``::1`` and ``localhost``); on loopback, reads are open.

Answers: 401 with ``WWW-Authenticate: Bearer`` when no key (or an unknown key) is sent, or when no
keys are configured at all (the message says how to set ``LAMBDA_API_KEYS``); 403 when the key is
known but lacks the scope (the message names the scope). Keys are compared in constant time
(``hmac.compare_digest`` against every configured key) and never appear in logs or error messages.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

if TYPE_CHECKING:
    from serving.api.config import ApiConfig

log = logging.getLogger(__name__)

SCOPES = ("read", "ingest", "admin")

#: Documents the scheme in the OpenAPI schema (the lock in /docs); the checks are ``require``'s own.
bearer = HTTPBearer(
    auto_error=False,
    scheme_name="APIKey",
    bearerFormat="API key",
    description=(
        "An API key from LAMBDA_API_KEYS, sent as `Authorization: Bearer <key>`. Scopes: `read` "
        "(views and batch runs: GET routes; needed only when the server binds to a non-loopback address), "
        "`ingest` (POST /v1/events), `admin` (POST /v1/batch/runs)."
    ),
)

_CONFIGURE_HINT = (
    "set LAMBDA_API_KEYS to a JSON object of keys and their scopes, e.g. "
    "LAMBDA_API_KEYS='{\"<a long random key>\": [\"read\", \"ingest\", \"admin\"]}', and restart the server"
)


def is_loopback(host: str) -> bool:
    """Whether binding to ``host`` keeps the server reachable from this machine only."""
    host = host.strip().strip("[]").rstrip(".").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False  # any other host name may resolve to a public address
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


@dataclass(frozen=True)
class _Policy:
    """What one app's settings say about keys, computed once per settings object."""

    settings: ApiConfig
    keys: tuple[tuple[bytes, frozenset[str]], ...]
    reads_open: bool

    @classmethod
    def of(cls, settings: ApiConfig) -> _Policy:
        keys = tuple((k.encode(), frozenset(scopes)) for k, scopes in (settings.api_keys or {}).items())
        return cls(settings, keys, is_loopback(settings.http_host))

    def scopes_of(self, presented: str) -> frozenset[str] | None:
        """The scopes of ``presented``, or None for an unknown key. Compares with every configured
        key, each in constant time, so timing says neither which key matched nor how much of one."""
        candidate = presented.encode()
        found: frozenset[str] | None = None
        for key, scopes in self.keys:
            if hmac.compare_digest(candidate, key) and found is None:
                found = scopes
        return found


def _policy(request: Request) -> _Policy:
    state = request.app.state
    settings = state.settings
    policy: _Policy | None = getattr(state, "auth_policy", None)
    if policy is None or policy.settings is not settings:
        policy = _Policy.of(settings)
        state.auth_policy = policy
    return policy


def _refuse(request: Request, status: int, detail: str) -> HTTPException:
    # The detail never holds the key; neither does this log line.
    log.info("refused %s %s (%d): %s", request.method, request.url.path, status, detail)
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return HTTPException(status_code=status, detail=detail, headers=headers)


def require(scope: str) -> Callable[..., Any]:
    """A FastAPI dependency that admits requests whose key has ``scope`` (see the module doc)."""
    if scope not in SCOPES:
        raise ValueError(f"unknown scope {scope!r}: use one of {', '.join(SCOPES)}")
    what = {"read": "reading views and batch runs", "ingest": "ingesting events", "admin": "starting batch runs"}[scope]

    async def _require(
        request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]
    ) -> None:
        policy = _policy(request)
        if scope == "read" and policy.reads_open:
            return
        if not policy.keys:
            raise _refuse(
                request, 401,
                f"no API keys are configured, so {what} (scope {scope!r}) is refused: {_CONFIGURE_HINT}",
            )
        if credentials is None:
            if request.headers.get("authorization"):
                problem = "the Authorization header is not of the form 'Bearer <key>'"
            else:
                problem = "no API key was sent"
            raise _refuse(
                request, 401, f"{problem}: send 'Authorization: Bearer <key>' with a key that has scope {scope!r}"
            )
        scopes = policy.scopes_of(credentials.credentials)
        if scopes is None:
            raise _refuse(request, 401, f"unknown API key: send a key from LAMBDA_API_KEYS that has scope {scope!r}")
        if scope not in scopes:
            held = ", ".join(sorted(scopes)) or "none"
            raise _refuse(
                request, 403, f"this API key lacks scope {scope!r}, which {what} needs (its scopes: {held})"
            )

    _require.__name__ = f"require_{scope}"
    return _require
