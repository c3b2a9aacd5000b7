"""Redis clients of the platform: the one place that decides how long a caller waits for Redis.

Two policies: *patient* for jobs (batch publish, speed layer, scheduler): six retries with
exponential backoff up to 2 s, riding out a Redis restart; *fail fast* for request handlers:
two quick retries and short socket timeouts, so a request answers 503 within a few seconds
instead of hanging while Redis is away.
"""

from __future__ import annotations

from typing import Any

import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

_RETRY_ON = [RedisConnectionError, RedisTimeoutError]


def _patient() -> dict[str, Any]:
    return {"retry": Retry(ExponentialBackoff(cap=2.0, base=0.05), retries=6), "retry_on_error": _RETRY_ON,
            "health_check_interval": 30}


def _fail_fast(retry_class: type[Retry] | type[AsyncRetry] = Retry) -> dict[str, Any]:
    return {"retry": retry_class(ExponentialBackoff(cap=0.2, base=0.02), retries=2), "retry_on_error": _RETRY_ON,
            "socket_connect_timeout": 1.0, "socket_timeout": 2.0}


def redis_client(url: str, *, fail_fast: bool = False, decode: bool = False) -> redis.Redis:
    """A client for ``url``: patient (jobs) or ``fail_fast`` (request handlers); ``decode`` answers str."""
    options = _fail_fast() if fail_fast else _patient()
    return redis.Redis.from_url(url, decode_responses=decode, **options)


def async_redis_client(url: str, *, max_connections: int = 64) -> aioredis.Redis:
    """The API's async client: fail fast (a read answers 503 rather than hang while Redis is away)."""
    return aioredis.Redis.from_url(url, max_connections=max_connections, **_fail_fast(AsyncRetry))
