"""The speed hash's writer (``SpeedHealth``) and its reader (``SpeedHeartbeat``) agree, through a real Redis.

Oracle: the values written, read back by the reader and by a plain HGETALL.
"""

from __future__ import annotations

import time

import redis

from serving.store.heartbeat import SpeedHealth, SpeedHeartbeat
from serving.store.keys import Keys


def test_what_the_writer_says_the_reader_reads(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    key = Keys("heartbeat_writer").speed
    try:
        client.delete(key)
        writer = SpeedHealth(client, key)
        writer.started(query="q1", started_after=4)
        writer.rebuilt_from(4)
        before = time.time()
        writer.beat(query="q1", state="running", ui_url="")
        beat = SpeedHeartbeat.from_hash(client.hgetall(key))
        assert (beat.processed, beat.state, beat.ui_url, beat.failures) == (4, "running", None, 0)
        assert beat.beat_at is not None and beat.beat_at >= before
        assert client.hget(key, "started_after") == b"4" and client.hget(key, "query") == b"q1"
        assert writer.record_failure(ValueError("poison")) == 1
        assert SpeedHeartbeat.from_hash(client.hgetall(key)).failure().startswith("ValueError: poison")
    finally:
        client.delete(key)
        client.close()
