"""Redis clients of the platform: the one place that decides how long a caller waits for Redis,
and whether the store is one Redis or a Redis Cluster.

Two policies: *patient* for jobs (batch publish, speed layer, scheduler): six retries with
exponential backoff up to 2 s, riding out a Redis restart; *fail fast* for request handlers:
two quick retries and short socket timeouts, so a request answers 503 within a few seconds
instead of hanging while Redis is away.

The URL selects the topology: ``redis://`` / ``rediss://`` / ``unix://`` is one Redis;
``redis+cluster://host:port[,host:port...][?buckets=N]`` is a Redis Cluster reached through any of
its nodes, with rows spread over ``N`` slot buckets (default 16; ``serving.store.keys``).
"""

from __future__ import annotations

import functools
from typing import Any
from urllib.parse import parse_qs, urlsplit, urlunsplit

import hiredis
import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode as AsyncClusterNode
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.connection import HiredisRespSerializer
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from serving.store.errors import StoreError
from serving.store.keys import Keys

_RETRY_ON = [RedisConnectionError, RedisTimeoutError]
CLUSTER_SCHEME = "redis+cluster"
DEFAULT_BUCKETS = 16


def _patient() -> dict[str, Any]:
    return {"retry": Retry(ExponentialBackoff(cap=2.0, base=0.05), retries=6), "retry_on_error": _RETRY_ON,
            "health_check_interval": 30}


def _fail_fast(retry_class: type[Retry] | type[AsyncRetry] = Retry, *, timeouts: bool = True) -> dict[str, Any]:
    """``timeouts``: a call that timed out is sent again (False: only one that could not be sent, on a
    connection error; a timed-out script may still be running, and a retry would queue it a second time)."""
    retry_on = _RETRY_ON if timeouts else [RedisConnectionError]  # (a Retry's own default retries timeouts too)
    return {"retry": retry_class(ExponentialBackoff(cap=0.2, base=0.02), retries=2, supported_errors=tuple(retry_on)),
            "retry_on_error": retry_on, "socket_connect_timeout": 1.0, "socket_timeout": 2.0}


def is_cluster(url: str) -> bool:
    return urlsplit(url).scheme == CLUSTER_SCHEME


def bucket_count(url: str) -> int:
    """How many slot buckets the store at ``url`` spreads rows over: 1 on one Redis."""
    if not is_cluster(url):
        return 1
    values = parse_qs(urlsplit(url).query).get("buckets", [str(DEFAULT_BUCKETS)])
    try:
        count = int(values[-1])
    except ValueError:
        count = 0
    if not 1 <= count <= 16384:
        raise StoreError(f"buckets={values[-1]!r} in the Redis URL must be a whole number from 1 to 16384")
    return count


def store_keys(pipeline: str, url: str) -> Keys:
    """The key names of ``pipeline`` in the store at ``url`` (bucketed on a cluster)."""
    return Keys(pipeline, buckets=bucket_count(url))


def _cluster_nodes(url: str) -> tuple[list[tuple[str, int]], dict[str, Any]]:
    parts = urlsplit(url)
    nodes = []
    for hostport in parts.netloc.rsplit("@", 1)[-1].split(","):
        host, _, port = hostport.rpartition(":")
        if not host or not port.isdigit():
            raise StoreError(f"Redis Cluster URL {urlunsplit(parts._replace(netloc=hostport))!r}: each node must be "
                             "host:port, e.g. redis+cluster://127.0.0.1:7000,127.0.0.1:7001")
        nodes.append((host, int(port)))
    auth: dict[str, Any] = {}
    if "@" in parts.netloc:
        user, _, password = parts.netloc.rsplit("@", 1)[0].partition(":")
        auth = {"username": user or None, "password": password or None}
    return nodes, auth


def check_cluster_url(url: str) -> None:
    """Raise StoreError naming what is wrong with a ``redis+cluster://`` URL (nodes, bucket count)."""
    _cluster_nodes(url)
    bucket_count(url)


def redis_client(url: str, *, fail_fast: bool = False, decode: bool = False) -> redis.Redis:
    """A client for ``url``: patient (jobs) or ``fail_fast`` (request handlers); ``decode`` answers str.

    On a cluster URL, a ``RedisCluster`` (typed as ``redis.Redis``: it answers the same commands
    for keys of one slot, which is all the store sends it); on one Redis, commands are packed by
    ``_HiredisPacker``."""
    options = _fail_fast() if fail_fast else _patient()
    if is_cluster(url):
        nodes, auth = _cluster_nodes(url)
        options.pop("health_check_interval", None)
        cluster = RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in nodes], decode_responses=decode,
                               **auth, **options)
        return cluster  # type: ignore[return-value]
    return redis.Redis.from_url(url, decode_responses=decode, command_packer=_HiredisPacker(), **options)


def _hiredis_pack(args: tuple[Any, ...]) -> list[bytes] | None:
    """``args`` as one RESP command packed by hiredis (C), or None when hiredis does not take them as
    they are: then redis-py's own packer splits, copies or refuses them as always. That is a command
    name other than one plain word ('SCRIPT LOAD', bytes), a memoryview (hiredis would read a strided
    one's buffer as if it were contiguous), or a value that is not str, bytes, int or float. The bytes
    are those redis-py sends (``tests/serving/store/test_connection.py``)."""
    if isinstance(args[0], str) and args[0].isalnum() and memoryview not in set(map(type, args)):
        try:
            return [hiredis.pack_command(args)]
        except (TypeError, UnicodeError):
            pass
    return None


class _HiredisPacker(HiredisRespSerializer):
    """The sync connections' packer (redis-py's ``command_packer``): hiredis without redis-py's copy of
    every argument first (a generator over all of them, 4.3 against 2.4 us a row of the speed layer's
    2,000-row APPLY calls)."""

    def pack(self, *args: Any) -> list[bytes]:
        return _hiredis_pack(args) or super().pack(*args)


class _HiredisPacking:
    """Mixin for redis-py's async connections: commands packed by hiredis, as its sync connections
    pack them when hiredis is installed. Its async ones pack in Python: 19 us for the key read's
    12-argument EVALSHA against 2.5 us, a tenth of the read's client-side CPU."""

    def pack_command(self, *args: Any) -> list[bytes]:
        return _hiredis_pack(args) or super().pack_command(*args)  # type: ignore[misc]


@functools.cache
def _hiredis_packing(base: type) -> type:
    """``base`` (a redis-py async connection class: TCP, TLS, Unix socket) packing with hiredis."""
    return type(base.__name__, (_HiredisPacking, base), {"__doc__": base.__doc__})


def async_redis_client(url: str, *, max_connections: int = 64, retry_timeouts: bool = True) -> aioredis.Redis:
    """The API's async client: fail fast (a read answers 503 rather than hang while Redis is away);
    ``retry_timeouts=False``: a call that timed out is not sent again (for scripts of long work).

    On one Redis, its connections pack commands with hiredis (``_HiredisPacking``); a cluster client
    builds its nodes' connections itself, with redis-py's packer."""
    if is_cluster(url):
        nodes, auth = _cluster_nodes(url)
        options = _fail_fast(AsyncRetry, timeouts=retry_timeouts)
        cluster = AsyncRedisCluster(startup_nodes=[AsyncClusterNode(h, p) for h, p in nodes],
                                    max_connections=max_connections, **auth, **options)
        return cluster  # type: ignore[return-value]
    client = aioredis.Redis.from_url(url, max_connections=max_connections,
                                     **_fail_fast(AsyncRetry, timeouts=retry_timeouts))
    pool = client.connection_pool  # its class follows the URL's scheme; no connection is made yet
    pool.connection_class = _hiredis_packing(pool.connection_class)  # type: ignore[arg-type]
    return client
