"""A session top-N's read (``SessionReads.every_key``) in a real Redis, rows stored as the layers store them:
every key's batch row and committed realtime row (a row a micro-batch not yet committed has changed reads as
saved before it), and a refusal naming ``LAMBDA_SESSION_TOP_BYTES`` as soon as the rows read pass the bytes
bound (the Lua call stops there: its reply never holds more), or ``LAMBDA_MAX_SESSION_TOP_KEYS`` past the rows."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from serving.store.connection import redis_client, store_keys
from serving.store.generation_meta import GenerationMeta
from serving.store.reader import ServingStore
from serving.store.session import PipelineStore
from serving.store.session_reads import SessionReads, TopTooLargeError
from shared_logic.measures import Count
from shared_logic.session_parts import encode_part, part_of_events
from shared_logic.sessions import SESSIONS_COLUMN, SessionWindow

MEASURES = (Count(),)
WINDOW = SessionWindow(timedelta(seconds=10))
GENERATION, PROCESSED = 5, 9


def row(*times: int) -> bytes:
    return encode_part(MEASURES, part_of_events(WINDOW, MEASURES, ((t * 1_000_000, {}) for t in times))).encode()


def publish(url: str) -> tuple[dict[str, tuple[bytes, bytes]], int]:
    """Batch rows for 300 keys, realtime rows for some (one changed by a micro-batch in flight, saved in the undo
    log): the rows a read must give, and their bytes."""
    client, keys = redis_client(url), store_keys("probe", url)
    store = PipelineStore(client, keys)
    epoch = store.ensure_epoch()
    store.generations.begin(GENERATION, epoch)
    want: dict[str, tuple[bytes, bytes]] = {}
    for i in range(300):
        want[f"user{i:03d}"] = (row(*range(0, 60 * (i % 7 + 1), 30)), b"")
        client.hset(keys.rows(GENERATION, "v"), f"user{i:03d}", want[f"user{i:03d}"][0])
    assert store.generations.flip(GENERATION, epoch, GenerationMeta(measures={"v": [SESSIONS_COLUMN]}))
    client.hset(keys.segment_meta(GENERATION), "processed", PROCESSED)
    for key, realtime in (("user001", row(500)), ("late", row(7, 9))):
        client.hset(keys.segment_rows(GENERATION, "v"), key, realtime)
        want[key] = (want.get(key, (b"", b""))[0], realtime)
    client.hset(keys.segment_rows(GENERATION, "v"), "user002", row(900))  # in flight: reads as saved before it
    client.hset(keys.segment_undo(GENERATION, "v"), "user002", b"")
    client.set(keys.segment_undo_tag(GENERATION, "v"), PROCESSED + 1)
    client.close()
    return want, sum(len(k) + len(b) + len(r) for k, (b, r) in want.items())


def every_key(url: str, max_keys: int, max_bytes: int) -> dict[str, tuple[bytes, bytes]]:
    async def read() -> dict[str, tuple[bytes, bytes]]:
        store = ServingStore(url, "probe")
        try:
            return (await SessionReads(store, max_keys, max_bytes).every_key("v")).rows
        finally:
            await store.close()
    return asyncio.run(read())


def test_a_session_top_n_reads_every_row_within_its_bounds_and_refuses_past_them(redis_url: str) -> None:
    want, size = publish(redis_url)
    got = every_key(redis_url, 10_000, size + 10_000)
    assert got.pop("user002") == (want["user002"][0], b"")
    assert got == {k: v for k, v in want.items() if k != "user002"}
    with pytest.raises(TopTooLargeError, match="LAMBDA_SESSION_TOP_BYTES"):
        every_key(redis_url, 10_000, size // 2)
    with pytest.raises(TopTooLargeError, match="LAMBDA_MAX_SESSION_TOP_KEYS"):
        every_key(redis_url, 100, size + 10_000)
