"""The API's async Redis client packs commands with hiredis and sends what redis-py's own packer sends.

The oracle is redis-py's Python packer (``Connection.pack_command`` of the class the client wraps):
for every kind of argument the platform passes, the bytes on the wire are the same; for what the
fast path does not take (several-word command names, values redis-py refuses), redis-py's packer
answers as it always does. Then the client runs against a real Redis.
"""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio.connection import Connection, UnixDomainSocketConnection
from redis.exceptions import DataError

from serving.store.connection import _hiredis_packing, _HiredisPacking, async_redis_client

COMMANDS: list[tuple] = [
    ("GET", "k"),
    ("HGET", "lambda:wordcount:g:2:rows:word_counts", "ünï cödé"),
    ("EVALSHA", "a" * 40, 1, "lambda:wordcount:current", "lambda:wordcount", "word_counts", 1, "count", 0, 1,
     "alice|bob", ""),
    ("SET", b"\x00\xff binary", b"", ),
    ("SET", "k", 0.1 + 0.2),
    ("SET", "k", -(2**70)),
    ("SET", "k", 1e-7),
    ("SET", "k", float("inf")),
    ("SET", "k", "x" * 100_000),  # past redis-py's buffer cutoff: it sends the value as a separate chunk
    ("CONFIG GET", "maxmemory"),  # several words: redis-py splits them
    (b"SCRIPT LOAD", "return 1"),
]


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: str(a[0]))
def test_packs_the_bytes_redis_py_packs(args: tuple) -> None:
    for base in (Connection, UnixDomainSocketConnection):
        packed = b"".join(_hiredis_packing(base)().pack_command(*args))
        assert packed == b"".join(base().pack_command(*args)), (base, args)


@pytest.mark.parametrize("value", [True, None, object(), "\ud800"])
def test_refuses_what_redis_py_refuses(value: object) -> None:
    with pytest.raises((DataError, UnicodeError)) as expected:
        Connection().pack_command("SET", "k", value)
    with pytest.raises(expected.type):
        _hiredis_packing(Connection)().pack_command("SET", "k", value)


def test_round_trip_on_a_real_redis(redis_url: str) -> None:
    async def run() -> None:
        client = async_redis_client(redis_url)
        try:
            script = client.register_script("return {KEYS[1], ARGV[1], ARGV[2], ARGV[3], #ARGV}")
            reply = await script(keys=["k"], args=["ünï", b"\x00\xff", 12.5, *range(20)])
            assert reply == [b"k", "ünï".encode(), b"\x00\xff", b"12.5", 23]
            await client.hset("h", "f", "v" * 100_000)
            assert await client.hget("h", "f") == b"v" * 100_000
            assert await client.config_get("maxmemory")  # a two-word command
            with pytest.raises(DataError):
                await client.set("k", True)  # type: ignore[arg-type]
            async with client.client() as single:
                connection = single.connection
                assert connection is not None and isinstance(connection, _HiredisPacking)
        finally:
            await client.aclose()

    asyncio.run(run())
