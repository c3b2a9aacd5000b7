"""A generation's record (``GenerationMeta``): written and read back whole, and its Lua twins name the same fields.

Oracles: the record itself (``from_hash(to_hash(m)) == m`` through a real Redis hash), and for the
Lua twins, the fields ``header_fields`` spells in Python, compared with what ``meta_header`` returns
when Redis runs it.
"""

from __future__ import annotations

import redis

from serving.store.generation_meta import LOGIC, LUA_META, VERSION, GenerationMeta, MetaHeader, header_fields

FULL = GenerationMeta(run_id="r1", computed_at=1700000000.25, events=12, logic="abc123",
                      rows={"a": 3, "b|c": 0}, measures={"a": ["count", "sum_x"], "b|c": ["count"]},
                      integral={"a": ["count"], "b|c": []}, views={"a": "View(a)", "b|c": "View(b|c)"},
                      version=7, published_at=1700000001.5)


def test_a_record_reads_back_as_written_through_redis(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    try:
        for meta in (FULL, GenerationMeta(), GenerationMeta(measures={"v": ["count"]})):
            client.delete("meta")
            if meta.to_hash():
                client.hset("meta", mapping=meta.to_hash())
            assert GenerationMeta.from_hash(client.hgetall("meta")) == meta
    finally:
        client.close()


def test_missing_fields_are_not_written() -> None:
    assert GenerationMeta().to_hash() == {}
    assert GenerationMeta(logic="x").to_hash() == {LOGIC: "x"}


def test_the_lua_twins_name_the_fields_python_names(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        for view in ("word_counts", "b|c"):
            fields = client.eval(f"{LUA_META}\nreturn {{meta_header(ARGV[1])}}", 0, view)
            assert tuple(fields) == header_fields(view)
            assert len(fields) == len(MetaHeader._fields)
        assert client.eval(f"{LUA_META}\nreturn {{META_VERSION, META_LOGIC}}", 0) == [VERSION, LOGIC]
    finally:
        client.close()
