"""Commands Spark packs (``serving.store.packed``) are the bytes redis-py packs, and a real Redis takes them.

The oracle for the bytes is hiredis's ``pack_command`` (what the platform's clients send); for what
lands in Redis, the values written the ordinary way. Keys and values carry multi-byte UTF-8, the
protocol's own CR LF and the JSON escapes, where a length in characters instead of bytes, or a
missing escape, would desynchronize the stream.
"""

from __future__ import annotations

from typing import Any

import hiredis
import pyarrow as pa
import pytest
import redis
from pyspark.sql import functions as F

from serving.store.packed import PackedCommandError, PackedWriter, array_command, bulk, header, span

KEYS = ["plain", "ünï cödé", "line\r\nbreak", "emoji 😀", "", "quote\"back\\slash"]
MEMBERS = [["a", "b"], ["ü", "😀", "x\r\ny"], [], ["only"]]


def test_bulk_strings_and_whole_commands_match_hiredis(spark: Any) -> None:
    df = spark.createDataFrame(list(zip(KEYS, MEMBERS + MEMBERS)), "k string, m array<string>")
    out = df.select("k", "m", bulk(F.col("k")).alias("b"), array_command("PFADD", F.col("k"), F.col("m")).alias("c"))
    for row in out.collect():
        full = hiredis.pack_command(("X", row.k))
        assert row.b.encode() == full[full.index(b"\r\n", 9) + 2:]  # the key's bulk string, after *2 and $1 X
        assert row.c.encode() == hiredis.pack_command(("PFADD", row.k, *row.m))


def test_a_header_and_a_span_of_packed_fields_make_the_command_hiredis_packs(spark: Any) -> None:
    fields = [(k, f"[{i}.0,null]") for i, k in enumerate(KEYS)]
    df = spark.createDataFrame(fields, "k string, v string")
    entries = pa.array([r.e for r in df.select(F.concat(bulk(F.col("k")), bulk(F.col("v"))).alias("e")).collect()])
    for start, stop in [(0, len(fields)), (1, 4), (2, 3), (3, 3)]:
        sliced = entries.slice(1) if start else entries  # a sliced array has an offset into its buffers
        lo, hi = (start - 1, stop - 1) if start else (start, stop)
        packed = header(("HSET", "h"), 2 * (stop - start)) + bytes(span(sliced, lo, hi))
        flat = [part for pair in fields[start:stop] for part in pair]
        assert packed == hiredis.pack_command(("HSET", "h", *flat))


def test_a_large_string_array_spans_too() -> None:
    values = pa.array(["$1\r\na\r\n", "$2\r\nbc\r\n"], type=pa.large_string())
    assert bytes(span(values, 0, 2)) == b"$1\r\na\r\n$2\r\nbc\r\n"


def test_the_writer_sends_every_command_and_redis_holds_what_was_packed(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    writer = PackedWriter(client)
    members = [f"m{i}" for i in range(300)]
    writer.queue("h", [header(("HSET", "h"), 4), _bulk_pairs(("ü", "1"), ("b", "[2]"))], 1)
    writer.queue("s", [hiredis.pack_command(("PFADD", "s", *members)), hiredis.pack_command(("SET", "x", "y"))], 2)
    assert writer.flush() == 3
    assert client.hgetall("h") == {"ü".encode(): b"1", b"b": b"[2]"}
    assert client.pfcount("s") == pytest.approx(300, rel=0.03) and client.get("x") == b"y"
    assert writer.flush() == 0  # nothing queued: nothing sent
    writer.close()


def test_a_refused_command_fails_the_flush_by_name_and_the_next_flush_works(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    client.set("str", "v")
    writer = PackedWriter(client)
    writer.queue("str", [hiredis.pack_command(("HSET", "str", "f", "v")), hiredis.pack_command(("SET", "after", "1"))], 2)
    with pytest.raises(PackedCommandError, match=r"command 1 of 2.*WRONGTYPE"):
        writer.flush()
    writer.queue("ok", [hiredis.pack_command(("SET", "ok", "1"))], 1)
    assert writer.flush() == 1 and client.get("ok") == b"1"
    writer.close()


def _bulk_pairs(*pairs: tuple[str, str]) -> bytes:
    return b"".join(b"$%d\r\n%s\r\n" % (len(p.encode()), p.encode()) for pair in pairs for p in pair)


def test_a_null_member_is_left_out_not_counted(spark: Any) -> None:
    df = spark.createDataFrame([("k", ["a", None, "b"])], "k string, m array<string>")
    (row,) = df.select(array_command("PFADD", F.col("k"), F.col("m")).alias("c")).collect()
    assert row.c.encode() == hiredis.pack_command(("PFADD", "k", "a", "b"))


def test_on_a_cluster_commands_reach_their_slots_owner_and_a_dropped_connection_is_sent_again(cluster_url: str) -> None:
    from serving.store.connection import redis_client

    client = redis_client(cluster_url)
    writer = PackedWriter(client)
    keys = [f"{{t{i}}}:k" for i in range(12)]  # hash tags over several slots, so several masters
    for key in keys:
        writer.queue(key, [hiredis.pack_command(("SET", key, "1"))], 1)
    assert writer.flush() == len(keys) and len({client.get_node_from_key(k).name for k in keys}) > 1
    for node in client.get_primaries():  # every master drops its clients: the writer's too
        client.get_redis_connection(node).client_kill_filter(_type="normal", skipme=True)
    for key in keys:
        writer.queue(key, [hiredis.pack_command(("SET", key, "2"))], 1)
    assert writer.flush() == len(keys)
    assert [client.get(k) for k in keys] == [b"2"] * len(keys)
    client.set(keys[0], "not a hash")
    for key in keys:
        writer.queue(key, [hiredis.pack_command(("HSET", key, "f", "v"))], 1)
    with pytest.raises(PackedCommandError, match="WRONGTYPE"):
        writer.flush()
    assert writer.flush() == 0  # what other nodes had queued went with the failure, not into the next flush
    writer.close()
    client.close()
