"""HTTP for tests: httpx's calls, all on one TLS context per test process.

httpx builds a new SSL context for every client, so for every ``httpx.get`` too, even when the URL is
plain HTTP to loopback, as all of the suite's are. With OpenSSL 3 that means parsing certifi's bundle:
60-90 ms of CPU each time, about 55 CPU-s of a run's test processes (run 40 under py-spy), most of it in
polling loops. These take httpx's own arguments and return httpx's own objects.
"""

from __future__ import annotations

from typing import Any

import httpx

_TLS = httpx.create_ssl_context()  # httpx's own default, built once


def client(**kwargs: Any) -> httpx.Client:
    """``httpx.Client(**kwargs)`` on the shared TLS context."""
    return httpx.Client(verify=_TLS, **kwargs)


def get(url: str, **kwargs: Any) -> httpx.Response:
    """``httpx.get(url, **kwargs)`` on the shared TLS context."""
    return httpx.get(url, verify=_TLS, **kwargs)


def post(url: str, **kwargs: Any) -> httpx.Response:
    """``httpx.post(url, **kwargs)`` on the shared TLS context."""
    return httpx.post(url, verify=_TLS, **kwargs)
