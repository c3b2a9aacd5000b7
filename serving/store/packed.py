"""Commands packed by Spark and sent as they are: Redis's mass insertion, for loading a generation.

Loading a batch generation writes a hash field per view row (and, for rows with many distinct
values, a PFADD of them). Turning each row into Python objects, JSON and redis-py arguments cost
the workers about 12 us a row, several times what Redis spends storing it. Here the JVM spells
each row's share of the commands in RESP, the protocol's own framing (``bulk``, ``array_command``),
in the Spark stage that reads gold; a worker adds one header per command and writes the Arrow
buffers to the socket as they are (``PackedWriter``): no Python per row. Every reply is read and
checked, so a refused command fails the load rather than leave a hole.

Every command sent this way must be idempotent (HSET of a field's final value, PFADD): after a
lost connection the whole flush is sent again.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import hiredis
import numpy as np
import pyarrow as pa
import redis
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.connection import Connection
from redis.retry import Retry

from serving.store.errors import StoreError

if TYPE_CHECKING:
    from pyspark.sql import Column

CRLF = "\r\n"


class PackedCommandError(StoreError):
    """Redis refused a packed command: the load is incomplete."""


# -- the JVM half: RESP spelled as Spark columns --------------------------------------------------

def bulk(value: Column) -> Column:
    """A string column as RESP bulk strings: ``$<length in bytes>\\r\\n<value>\\r\\n`` (null stays null)."""
    from pyspark.sql import functions as F

    return F.concat(F.lit("$"), F.octet_length(value).cast("string"), F.lit(CRLF), value, F.lit(CRLF))


def array_command(name: str, key: Column, members: Column) -> Column:
    """One whole command per row: ``name key member...`` for every element of the string array
    ``members`` but nulls (the form of PFADD and SADD). Null when ``members`` is null."""
    from pyspark.sql import functions as F

    present = F.filter(members, lambda m: m.isNotNull())  # a null would be counted, not sent
    head = F.concat(F.lit("*"), (F.size(present) + 2).cast("string"), F.lit(CRLF), F.lit(_bulk(name.encode()).decode()))
    return F.concat(head, bulk(key), F.array_join(F.transform(present, bulk), ""))


# -- the worker half: send buffers, check replies ---------------------------------------------------

def _bulk(value: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(value), value)


def span(values: pa.Array, start: int, stop: int) -> memoryview:
    """The bytes of ``values[start:stop]`` (an Arrow string or binary array without nulls: ``bulk``
    spelled them), as they lie side by side in its data buffer: a view, no copy."""
    _, offsets, data = values.buffers()
    width = np.int64 if pa.types.is_large_string(values.type) or pa.types.is_large_binary(values.type) else np.int32
    at = np.frombuffer(offsets, dtype=width, count=len(values) + 1 + values.offset)[values.offset:]
    return memoryview(data)[int(at[start]):int(at[stop])] if data is not None else memoryview(b"")


def command(*args: Any) -> bytes:
    """One whole command of str or bytes arguments, packed by hiredis (as the platform's clients pack theirs)."""
    packed: bytes = hiredis.pack_command(args)
    return packed


def header(args: Sequence[str], more: int) -> bytes:
    """The start of a command of ``args`` followed by ``more`` arguments packed elsewhere (``bulk``)."""
    return b"*%d\r\n" % (len(args) + more) + b"".join(_bulk(a.encode()) for a in args)


@dataclass
class _Queue:
    """What waits to go to one node, on the connection it goes by (taken from ``pool``)."""

    node: str
    route: str
    """A key of one of its commands: after a failover, the node that now serves it (a master's
    slots move to one replica together)."""
    pool: redis.ConnectionPool
    connection: Connection
    parts: list[bytes | memoryview] = field(default_factory=list)
    commands: int = 0

    def send(self) -> None:
        """Write everything in one go, then read and check a reply per command."""
        self.connection.send_packed_command([b"".join(self.parts)])
        for i in range(self.commands):
            try:
                self.connection.read_response()
            except redis.ResponseError as e:
                self.connection.disconnect()  # the rest of the replies are unread
                where = f" on {self.node}" if self.node else ""
                raise PackedCommandError(f"Redis refused packed command {i + 1} of {self.commands}{where}: {e}") from e

    def clear(self) -> None:
        self.parts.clear()
        self.commands = 0


class PackedWriter:
    """Queues packed commands per Redis node and sends each node's queue in one write (``flush``),
    then reads every reply. On a Redis Cluster a command goes to the master of its ``route`` key's
    slot; every key a command names must share that slot (the store's hash tags see to it).

    A lost connection is retried with the client's ``Retry`` (on a cluster, after asking it where
    the slots are now); everything sent this way must be idempotent. Not thread-safe; one per
    worker. ``close`` gives the connections back.
    """

    def __init__(self, client: redis.Redis) -> None:
        self._client = client
        self._cluster = isinstance(client, RedisCluster)
        retry = client.retry if isinstance(client, RedisCluster) else client.get_retry()
        self._retry = retry if retry is not None else Retry(NoBackoff(), retries=0)
        self._queues: dict[str, _Queue] = {}

    def queue(self, route: str, packed: Sequence[bytes | memoryview], commands: int) -> None:
        """Queue ``packed``: the bytes of ``commands`` whole commands for the node of key ``route``."""
        if commands:
            queue = self._queue_for(route)
            queue.parts.extend(packed)
            queue.commands += commands

    def flush(self) -> int:
        """Send what is queued and read every reply; returns the commands sent. Raises
        PackedCommandError when Redis refused a command, redis.ConnectionError when a node stayed
        out of reach; either way nothing queued is kept (a writer that failed starts empty)."""
        sent = 0
        try:
            for queue in self._queues.values():
                if queue.commands:
                    self._retry.call_with_retry(queue.send, functools.partial(self._reconnect, queue))
                    sent += queue.commands
                    queue.clear()
        finally:
            for queue in self._queues.values():
                queue.clear()
        return sent

    def close(self) -> None:
        for queue in self._queues.values():
            queue.pool.release(queue.connection)
        self._queues.clear()

    def _reconnect(self, queue: _Queue, _error: Exception) -> None:
        queue.connection.disconnect()
        if self._cluster:
            assert isinstance(self._client, RedisCluster)
            queue.pool.release(queue.connection)
            self._client.nodes_manager.initialize()
            queue.node = self._node(queue.route)
            queue.pool = self._pool(queue.node)
            queue.connection = queue.pool.get_connection()

    def _queue_for(self, route: str) -> _Queue:
        node = self._node(route)
        if node not in self._queues:
            pool = self._pool(node)
            self._queues[node] = _Queue(node, route, pool, pool.get_connection())
        return self._queues[node]

    def _node(self, route: str) -> str:
        if isinstance(self._client, RedisCluster):
            return str(self._client.get_node_from_key(route).name)
        return ""

    def _pool(self, node: str) -> redis.ConnectionPool:
        if isinstance(self._client, RedisCluster):
            return self._client.get_redis_connection(self._client.get_node(node_name=node)).connection_pool
        return self._client.connection_pool
