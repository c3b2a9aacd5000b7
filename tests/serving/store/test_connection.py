"""The platform's Redis clients pack commands with hiredis and send what redis-py's own packers send.

The oracles are redis-py's packers: the Python one of the async connection classes the API's client
wraps, and the sync connections' default (hiredis behind a copy of every argument). For every kind
of argument the platform passes, the bytes on the wire are the same; what the fast path does not
take (several-word command names, values redis-py refuses) redis-py's packer answers as it always
does. Then both clients run against a real Redis.
"""

from __future__ import annotations

import asyncio

import pytest
import redis
from redis.asyncio.connection import Connection, UnixDomainSocketConnection
from redis.exceptions import DataError

from serving.store.connection import _hiredis_packing, _HiredisPacker, _HiredisPacking, async_redis_client, redis_client

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
    ("HGET\th", "f"),  # ... on any whitespace
    ("SET", "k", memoryview(b"contiguous")),
    (b"SCRIPT LOAD", "return 1"),
]


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: str(a[0]))
def test_packs_the_bytes_redis_py_packs(args: tuple) -> None:
    for base in (Connection, UnixDomainSocketConnection):
        packed = b"".join(_hiredis_packing(base)().pack_command(*args))
        assert packed == b"".join(base().pack_command(*args)), (base, args)
    assert b"".join(_HiredisPacker().pack(*args)) == b"".join(redis.Connection().pack_command(*args))


def test_a_strided_memoryview_is_copied_as_redis_py_does() -> None:
    args = ("SET", "k", memoryview(b"abcdef")[::2])  # hiredis alone would send the buffer's first 3 bytes
    assert b"".join(_HiredisPacker().pack(*args)) == b"".join(redis.Connection().pack_command(*args))
    assert b"".join(_HiredisPacker().pack(*args)).endswith(b"$3\r\nace\r\n")


@pytest.mark.parametrize("value", [True, None, object(), "\ud800"])
def test_refuses_what_redis_py_refuses(value: object) -> None:
    with pytest.raises((DataError, UnicodeError)) as expected:
        Connection().pack_command("SET", "k", value)
    with pytest.raises(expected.type):
        _hiredis_packing(Connection)().pack_command("SET", "k", value)
    with pytest.raises((DataError, UnicodeError)) as expected:
        redis.Connection().pack_command("SET", "k", value)
    with pytest.raises(expected.type):
        _HiredisPacker().pack("SET", "k", value)


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


def test_sync_round_trip_on_a_real_redis(redis_url: str) -> None:
    client = redis_client(redis_url)
    try:
        assert isinstance(client.connection_pool.connection_kwargs["command_packer"], _HiredisPacker)
        script = client.register_script("return {KEYS[1], ARGV[1], ARGV[2], ARGV[3], #ARGV}")
        assert script(keys=["k"], args=["ünï", b"\x00\xff", 12.5, *range(20)]) == [b"k", "ünï".encode(), b"\x00\xff",
                                                                                    b"12.5", 23]
        pipe = client.pipeline(transaction=True)
        pipe.hset("h", "f", bytearray(b"v" * 100_000))  # not taken by hiredis as it is: redis-py's packer sends it
        pipe.hget("h", "f")
        assert pipe.execute() == [1, b"v" * 100_000]
        assert client.config_get("maxmemory")
        with pytest.raises(DataError):
            client.set("k", True)  # type: ignore[arg-type]
    finally:
        client.close()


#: A script busy for 2.5 s: longer than the API client's 2 s socket timeout.
_BUSY = """local s = redis.call('TIME')
repeat local t = redis.call('TIME') until (t[1] - s[1]) * 1000000 + (t[2] - s[2]) > 2500000
return 1"""


@pytest.mark.slow  # over 2.5 s in a full run: the full tier (the quick tier has a 3-minute budget)
def test_a_script_that_timed_out_is_not_sent_again(redis_url: str) -> None:
    """A timed-out script may still be running: sending it again would queue it a second time behind itself."""
    async def run() -> None:
        client = async_redis_client(redis_url, retry_timeouts=False)
        try:
            with pytest.raises(redis.exceptions.TimeoutError):
                await client.eval(_BUSY, 0)
        finally:
            await client.aclose()

    plain = redis.Redis.from_url(redis_url)
    plain.config_resetstat()
    asyncio.run(run())
    for _ in range(100):  # Redis answers BUSY until the script is done
        try:
            calls = plain.info("commandstats")["cmdstat_eval"]["calls"]
            break
        except redis.exceptions.BusyLoadingError:
            raise
        except redis.exceptions.ResponseError:
            asyncio.run(asyncio.sleep(0.1))
    assert calls == 1
