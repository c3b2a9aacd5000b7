"""A batch run that dies midway (at injected points) leaves the served generation untouched; one
that outlives Redis's data (FLUSHALL after its barrier) serves nothing.

The run dies in process here (a BaseException no handler catches, raised at the fault point:
``run_batch`` has no cleanup a SIGKILL would skip, so the state left behind is the same). A real
SIGKILL of a `batch run` process is in tests/speed_layer/test_exactness.py.

Oracle: the Redis content of the served generation captured before the killed run, compared key
by key afterwards; then a clean run must serve the counts a plain-Python tally of all events gives.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import redis

from batch_layer.errors import PublishError
from batch_layer.faults import injected
from batch_layer.master.dataset import MasterDataset
from batch_layer.master.engines import get_engine
from batch_layer.recompute.job import run_batch
from serving.store.keys import Keys
from shared_logic import load_pipeline
from tests.support.dying import Died, die

pytestmark = pytest.mark.slow

WINDOWS = "tests.support.windows_pipeline"


def _dump(client: redis.Redis, keys: Keys, generation: int) -> dict[bytes, object]:
    """Every key of a generation with its content, whatever its kind (sorted sets with scores, hashes, sets,
    lists, strings such as sketches)."""
    read = {b"zset": lambda k: client.zrange(k, 0, -1, withscores=True), b"hash": client.hgetall,
            b"set": client.smembers, b"list": lambda k: client.lrange(k, 0, -1), b"string": client.get}
    return {key: read[client.type(key)](key) for key in client.scan_iter(match=f"{keys.generation_prefix(generation)}:*")}


def _ingest(master: MasterDataset, path: Path, events: list[dict[str, object]]) -> None:
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    master.ingest_file(path)


@pytest.mark.parametrize("fault", ["after-gold", "before-flip"])
def test_killed_run_leaves_previous_generation_served(spark, make_settings, tmp_path: Path, fault: str) -> None:
    settings = make_settings(pipeline="payments")
    pipeline = load_pipeline("payments")
    master = MasterDataset(settings.master_path, pipeline, get_engine(settings.storage_engine))
    first = [{"user_id": f"u{i % 4}", "merchant": f"m{i % 3}", "amount": i, "event_time": "2026-01-01T00:00:00Z"}
             for i in range(20)]
    _ingest(master, tmp_path / "first.jsonl", first)
    served = run_batch(spark, settings, pipeline, redis_url=settings.redis_url).generation
    client = redis.Redis.from_url(settings.redis_url)
    before = _dump(client, Keys("payments"), served)
    assert before

    second = [{"user_id": "u9", "merchant": "m9", "amount": 1, "event_time": "2026-01-01T00:00:00Z"}] * 5
    _ingest(master, tmp_path / "second.jsonl", second)
    with injected(fault, die), pytest.raises(Died):
        run_batch(spark, settings, pipeline, redis_url=settings.redis_url)

    keys = Keys("payments")
    assert int(client.get(keys.current)) == served
    assert _dump(client, keys, served) == before

    # The next clean run serves everything and drops what the killed run left behind.
    result = run_batch(spark, settings, pipeline, redis_url=settings.redis_url)
    assert int(client.get(keys.current)) == result.generation > served
    leftovers = {k for k in client.scan_iter(match=f"{keys.prefix}:g:*") if not k.startswith(
        f"{keys.generation_prefix(result.generation)}:".encode())}
    assert leftovers == set()
    counts = Counter(str(e["user_id"]) for e in first + second)
    stored = client.hgetall(keys.rows(result.generation, "spend_by_user"))
    position = json.loads(client.hget(keys.meta(result.generation), "measures:spend_by_user")).index("count")
    assert {k.decode(): int(json.loads(v)[position]) for k, v in stored.items()} == dict(counts)



def test_a_run_of_sliding_and_session_views_killed_at_its_flip_leaves_the_served_generation_whole(
        spark, make_settings, tmp_path: Path) -> None:
    """The same for a sliding view's panes and a session view's sessions: the killed run (dead at its flip, its
    whole generation written) leaves the served one as it was, and nothing of it is left once the next is served.
    (Their answers' exactness after a recompute: tests/serving/api/test_sliding_windows.py and test_session_windows.py.)"""
    settings = make_settings(pipeline=WINDOWS)
    pipeline = load_pipeline(WINDOWS)
    master = MasterDataset(settings.master_path, pipeline, get_engine(settings.storage_engine))
    start = 1_767_225_600  # 2026-01-01T00:00:00Z
    first = [{"song": f"s{i % 3}", "listener": f"l{i % 2}", "seconds": i + 1, "event_time": str(start + 240 * i)}
             for i in range(20)]
    _ingest(master, tmp_path / "first.jsonl", first)
    served = run_batch(spark, settings, pipeline, redis_url=settings.redis_url).generation
    client, keys = redis.Redis.from_url(settings.redis_url), Keys(pipeline.name)
    before = _dump(client, keys, served)
    assert before

    # Late plays that extend a session and bridge two, and fill panes already served.
    later = [{"song": "s0", "listener": f"l{i % 2}", "seconds": 7, "event_time": str(start + 240 * i + 120)}
             for i in range(0, 20, 3)]
    _ingest(master, tmp_path / "later.jsonl", later)
    with injected("before-flip", die), pytest.raises(Died):
        run_batch(spark, settings, pipeline, redis_url=settings.redis_url)
    assert int(client.get(keys.current)) == served
    assert _dump(client, keys, served) == before
    assert _others(client, keys, served), "the killed run wrote its generation (else nothing was tested)"

    result = run_batch(spark, settings, pipeline, redis_url=settings.redis_url)
    assert int(client.get(keys.current)) == result.generation > served
    assert _others(client, keys, result.generation) == set(), "the killed run's generation is dropped"


def _others(client: redis.Redis, keys: Keys, generation: int) -> set[bytes]:
    """Keys of generations other than ``generation``."""
    mine = f"{keys.generation_prefix(generation)}:".encode()
    return {k for k in client.scan_iter(match=f"{keys.prefix}:g:*") if not k.startswith(mine)}

def test_redis_losing_its_data_after_the_barrier_refuses_the_flip(spark, make_settings, tmp_path: Path) -> None:
    """The flip checks the epoch read *before* the barrier: a loss after it must not pass for the run's own epoch."""
    settings = make_settings(pipeline="payments")
    pipeline = load_pipeline("payments")
    master = MasterDataset(settings.master_path, pipeline, get_engine("delta-rs"))
    events = [{"user_id": f"u{i % 3}", "merchant": "m", "amount": i, "event_time": "2026-01-01T00:00:00Z"}
              for i in range(9)]
    _ingest(master, tmp_path / "events.jsonl", events)
    client = redis.Redis.from_url(settings.redis_url)
    keys = Keys("payments")

    with injected("after-barrier", client.flushall), pytest.raises(PublishError, match="lost its data"):
        run_batch(spark, settings, pipeline, redis_url=settings.redis_url)
    assert client.get(keys.current) is None
    assert list(client.scan_iter(match=f"{keys.prefix}:g:*")) == []

    result = run_batch(spark, settings, pipeline, redis_url=settings.redis_url)  # the next run publishes
    assert int(client.get(keys.current)) == result.generation
