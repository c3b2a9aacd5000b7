"""A micro-batch becomes visible at once: between two of its write calls a read is exactly the
state at the version it names (the last committed micro-batch), never half of the one in flight.
And a store never answers at a version older than one it already answered at.

Two write partitions of one micro-batch are played by two writers with their own guards (the same
tag, as two Spark partitions of one micro-batch have); reads go through ``ServingStore`` between
them. The oracle is a plain-Python tally of the rows each state includes.
"""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pytest
import redis
from pyspark.sql import functions as F

from batch_layer.faults import injected
from serving.api.key_pages import Listing, page_answer
from serving.api.queries import key_answer
from serving.store.errors import StoreUnavailableError
from serving.store.keys import Keys
from serving.store.reader import ServingStore
from serving.store.row_format import EXACT_DISTINCT_MAX, row_parts
from serving.store.segments import MAX_CHUNK_ROWS
from serving.store.session import PipelineStore
from shared_logic import Count, Distinct, Max, Min, Sum, TumblingWindow, View
from speed_layer.segments import (
    DEPTH,
    KEY,
    MEMBER,
    VALUE,
    WS,
    WriteSpec,
    apply_rows,
    encode,
    measure_spec,
    write_increments,
)
from speed_layer.segments import VIEW as VIEW_COL

VIEW = View("probe", keys=("k",), measures=(Count(), Sum("x"), Min("x"), Max("x"), Distinct("m")),
            window=TumblingWindow(timedelta(hours=1)))
T0 = datetime(2026, 1, 1, 10, 0, tzinfo=timezone.utc)
BASE = 10
SCALARS = ["count", "sum_x", "min_x", "max_x"]
# (key, x, merchant, minutes after T0)
COMMITTED = [("a", 5.0, "p", 1), ("a", 1.5, "q", 2), ("b", 2.0, "p", 3), ("c", 9.0, "r", 70)]
# The next micro-batch, in two write partitions that share a row (key a in the first window). Spark's
# partitions never do (the write partitions by row); a chunk boundary does, and then the shared row is
# the first of the later call, as a's is here (it sorts first): the one row a call looks up in the undo log.
FIRST = [("a", 7.0, "s", 4), ("d", 1.0, "p", 5), ("c", 0.5, "t", 75)]
SECOND = [("a", 0.25, "u", 6), ("b", 3.0, "v", 8), ("e", 4.0, "p", 80)]


def _write(spark, redis_url: str, epoch: str, query: str, batch_id: int, tag: int, rows: list,
           exact_max: int = EXACT_DISTINCT_MAX) -> None:
    frame = spark.createDataFrame(
        [(k, x, m, T0 + timedelta(minutes=mins)) for k, x, m, mins in rows],
        "k string, x double, m string, event_time timestamp",
    )
    encoded = encode(VIEW.aggregate(frame).withColumn(DEPTH, F.lit(1)), VIEW, (4, 1))
    spec = WriteSpec(redis_url, "probe", query, epoch, batch_id, tag, (BASE,), {"probe": measure_spec(VIEW)}, 2,
                     exact_max)
    write_increments(encoded, spec, partitions=2)


def _window(minutes: int) -> int:
    return int((T0 + timedelta(minutes=minutes)).timestamp()) // 3600 * 3600


def _oracle(rows: list) -> dict[tuple[str, int], dict]:
    tally: dict[tuple[str, int], dict] = {}
    for k, x, m, mins in rows:
        row = tally.setdefault((k, _window(mins)), {"x": [], "m": set()})
        row["x"].append(x)
        row["m"].add(m)
    return {item: {"count": len(r["x"]), "sum_x": sum(r["x"]), "min_x": min(r["x"]), "max_x": max(r["x"]),
                   "distinct_m": len(r["m"])} for item, r in tally.items()}


ITEMS = sorted(_oracle(COMMITTED + FIRST + SECOND))


async def _read(redis_url: str) -> tuple[int, dict, dict]:
    """(version named, realtime value of every item that has one, top-N by count per window)."""
    store = ServingStore(redis_url, "probe")
    try:
        return await _read_from(store)
    finally:
        await store.close()


async def _read_from(store: ServingStore) -> tuple[int, dict, dict]:
    read = await store.read("probe", ITEMS, SCALARS, ["distinct_m"])
    values = {}
    for item, part, distinct in zip(ITEMS, read.realtime, read.distinct_realtime):
        if part["count"] is not None:
            values[item] = {**{m: part[m] for m in SCALARS}, **distinct}
    tops = {}
    for window in sorted({w for _, w in ITEMS}):
        top = await store.top("probe", "count", window, 10)
        assert top.generation.version == read.generation.version
        tops[window] = top.realtime
    return read.generation.version, values, tops


def _expected(rows: list) -> tuple[dict, dict]:
    values = _oracle(rows)
    tops: dict[int, dict] = {w: {} for _, w in ITEMS}
    for (k, w), measures in values.items():
        tops[w][k] = measures["count"]
    return values, tops


# exact_max: the most distinct values a realtime row keeps as a list. At 1, rows turn into sketches in
# the middle of the test (a's first row in micro-batch 0, c's in micro-batch 1); at 0 every row is one.
# The third item: the rows whose sketches micro-batch 2 saves (those it touches that were sketches
# before it) and those micro-batch 1 saved in a window micro-batch 2 does not touch (c's).
@pytest.mark.slow  # over 10 s: the end-to-end tier
@pytest.mark.parametrize("exact_max, copied", [(EXACT_DISTINCT_MAX, set()), (1, {("a", 9)}), (0, {("a", 9), ("c", 70)})])
def test_a_micro_batch_is_invisible_until_committed_then_visible_at_once(
        spark, redis_url: str, exact_max: int, copied: set[tuple[str, int]]) -> None:
    client = redis.Redis.from_url(redis_url)
    keys = Keys("probe")
    epoch = PipelineStore(client, keys).ensure_epoch()
    client.set(keys.current, BASE)
    client.hset(keys.meta(BASE), "measures:probe", json.dumps(row_parts(VIEW)))

    def read() -> tuple[int, dict, dict]:
        return asyncio.run(_read(redis_url))

    def commit(tag: int) -> None:
        client.hset(keys.segment_meta(BASE), "processed", tag)

    def write(query: str, batch_id: int, tag: int, rows: list) -> None:
        _write(spark, redis_url, epoch, query, batch_id, tag, rows, exact_max)

    write("q1", 0, 100, COMMITTED)
    assert read() == (BASE, {}, {w: {} for _, w in ITEMS}), "an uncommitted micro-batch is visible"
    commit(100)
    committed = (100, *_expected(COMMITTED))
    assert read() == committed

    write("q1", 1, 200, FIRST)  # the first write partition of micro-batch 1
    assert read() == committed, "half a micro-batch is visible"
    write("q2", 1, 200, SECOND)  # the second one, touching rows the first did
    assert read() == committed, "an uncommitted micro-batch is visible"
    write("q1", 1, 200, FIRST)  # a replay of the first: the guard skips it
    assert read() == committed
    commit(200)
    assert read() == (200, *_expected(COMMITTED + FIRST + SECOND))

    # The next micro-batch starts the undo log of each window it touches over, dropping what was saved
    # there for the last one (b's entry, the sketches copied); a window it does not touch keeps its log (c's).
    later = [("a", 1.0, "w", 9)]
    write("q1", 2, 300, later)
    assert read() == (200, *_expected(COMMITTED + FIRST + SECOND))
    assert set(client.hkeys(keys.segment_undo(BASE, "probe", _window(9)))) == {b"a"}
    assert set(client.hkeys(keys.segment_undo(BASE, "probe", _window(70)))) == {b"c", b"e"}
    saved = {k.decode() for k in client.scan_iter(match=f"{keys.segment_prefix(BASE)}:probe:p:*")}
    assert saved == {keys.segment_previous(BASE, "probe", "distinct_m", f"{k}@{_window(mins)}") for k, mins in copied}
    commit(300)
    assert read() == (300, *_expected(COMMITTED + FIRST + SECOND + later))


def test_a_store_never_answers_at_a_version_older_than_it_answered_at(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    keys = Keys("probe")
    client.set(keys.current, BASE)
    client.hset(keys.meta(BASE), "measures:probe", json.dumps(row_parts(VIEW)))
    client.hset(keys.segment_meta(BASE), "processed", 50)

    async def scenario() -> None:
        store = ServingStore(redis_url, "probe")
        try:
            assert (await store.read("probe", [("a", None)], SCALARS, [])).generation.version == 50
            client.delete(keys.segment_meta(BASE))  # e.g. the speed layer rebuilding its segments from scratch
            with pytest.raises(StoreUnavailableError, match="older than version 50"):
                await store.read("probe", [("a", None)], SCALARS, [])
            with pytest.raises(StoreUnavailableError, match="older than version 50"):
                await store.top("probe", "count", None, 5)
            client.hset(keys.segment_meta(BASE), "processed", 60)  # caught up again
            assert (await store.top("probe", "count", None, 5)).generation.version == 60
        finally:
            await store.close()

    asyncio.run(scenario())


def _table(rows: list) -> pa.Table:
    """Encoded increments of ``VIEW`` (key, minutes after T0, depth, x, merchants), in the speed layer's write
    order (view, key, window, depth): each row one aggregated increment, as ``segments.encode`` shapes it."""
    rows = sorted(rows, key=lambda r: (r[0], _window(r[1]), r[2]))
    x = [str(r[3]) for r in rows]
    return pa.table({
        VIEW_COL: ["probe"] * len(rows), KEY: [r[0] for r in rows], WS: [str(_window(r[1])) for r in rows],
        DEPTH: pa.array([r[2] for r in rows], pa.int32()),
        f"{VALUE}0": ["1.0"] * len(rows), f"{VALUE}1": x, f"{VALUE}2": x, f"{VALUE}3": x,
        f"{MEMBER}0": [list(r[4]) for r in rows],
    })


@pytest.mark.parametrize("exact_max", [EXACT_DISTINCT_MAX, 0], ids=["exact", "sketches"])
def test_a_row_continued_across_a_chunk_boundary_keeps_its_committed_value(redis_url: str, exact_max: int) -> None:
    """A row's increments for two segments (depths 1 and 2) cut by a chunk boundary: the second chunk must keep
    the value the first saved for it, or a read between the chunks shows the first one's increment."""
    client = redis.Redis.from_url(redis_url)
    keys = Keys("probe")
    epoch = PipelineStore(client, keys).ensure_epoch()
    client.set(keys.current, BASE)
    client.hset(keys.meta(BASE), "measures:probe", json.dumps(row_parts(VIEW)))
    items = [("a", _window(1)), ("b", _window(1))]

    def write(batch_id: int, tag: int, bases: tuple[int, ...], rows: list) -> None:
        spec = WriteSpec(redis_url, "probe", "q1", epoch, batch_id, tag, bases, {"probe": measure_spec(VIEW)}, 1,
                         exact_max)
        apply_rows(spec, _table(rows), "0", client)

    async def realtime() -> tuple[int, dict]:
        store = ServingStore(redis_url, "probe")
        try:
            read = await store.read("probe", items, SCALARS, ["distinct_m"])
        finally:
            await store.close()
        return read.generation.version, {
            item: {**part, **distinct} for item, part, distinct in zip(items, read.realtime, read.distinct_realtime)
            if part["count"] is not None}

    write(0, 100, (BASE,), [("a", 1, 1, 5.0, ["p"])])
    client.hset(keys.segment_meta(BASE), "processed", 100)
    committed = asyncio.run(realtime())
    assert committed == (100, {items[0]: {"count": 1, "sum_x": 5.0, "min_x": 5.0, "max_x": 5.0, "distinct_m": 1}})

    # Micro-batch 1 meets a barrier at BASE + 5: a's row has an increment for the lower segment only (depth 1)
    # and one for both (depth 2); one row per chunk, so a's two increments land in two calls.
    reads: list[tuple[int, dict]] = []
    with injected("speed-between-chunks", lambda: reads.append(asyncio.run(realtime()))):
        write(1, 200, (BASE, BASE + 5), [("a", 1, 1, 2.0, ["q"]), ("a", 1, 2, 0.5, ["p", "r"]), ("b", 1, 1, 4.0, ["p"])])
    assert reads == [committed] * 3, "a read between the chunks saw part of the micro-batch in flight"
    client.hset(keys.segment_meta(BASE), "processed", 200)
    assert asyncio.run(realtime()) == (200, {
        items[0]: {"count": 3, "sum_x": 7.5, "min_x": 0.5, "max_x": 5.0, "distinct_m": 3},
        items[1]: {"count": 1, "sum_x": 4.0, "min_x": 4.0, "max_x": 4.0, "distinct_m": 1},
    })


def test_rows_changed_between_reading_and_writing_are_read_and_merged_again(redis_url: str) -> None:
    """Another writer changes a row after a chunk read it and before its call: the call refuses the stale
    merge, and the chunk is read and merged again on top of the other writer's value."""
    client = redis.Redis.from_url(redis_url)
    keys = Keys("probe")
    epoch = PipelineStore(client, keys).ensure_epoch()
    client.set(keys.current, BASE)
    client.hset(keys.meta(BASE), "measures:probe", json.dumps(row_parts(VIEW)))
    row = keys.segment_rows(BASE, "probe", _window(1))
    other = json.dumps(["2.0", "10.0", "3.0", "7.0", ["x", "y"]])
    reads = []

    def write_between() -> None:
        reads.append(client.hget(row, "a"))
        if len(reads) == 1:
            client.hset(row, "a", other)

    spec = WriteSpec(redis_url, "probe", "q1", epoch, 0, 100, (BASE,), {"probe": measure_spec(VIEW)}, 10)
    with injected("speed-after-read", write_between):
        apply_rows(spec, _table([("a", 1, 1, 5.0, ["p", "x"])]), "0", client)
    assert reads == [None, other.encode()]
    client.hset(keys.segment_meta(BASE), "processed", 100)

    async def realtime() -> dict:
        store = ServingStore(redis_url, "probe")
        try:
            read = await store.read("probe", [("a", _window(1))], SCALARS, ["distinct_m"])
        finally:
            await store.close()
        return {**read.realtime[0], **read.distinct_realtime[0]}

    assert asyncio.run(realtime()) == {"count": 3, "sum_x": 15.0, "min_x": 3.0, "max_x": 7.0, "distinct_m": 3}


def test_a_chunk_of_rows_with_several_sketches_each_is_applied_whole(redis_url: str) -> None:
    """A chunk of MAX_CHUNK_ROWS rows of one window, each already holding sketches of four distinct measures
    (exact_max 0: no row keeps its values as a list): the micro-batch saves a copy of each, more than Lua's
    unpack() takes at once, and applies every row."""
    view = View("wide", keys=("k",), measures=(Count(), *(Distinct(f"m{j}") for j in range(4))))
    client = redis.Redis.from_url(redis_url)
    keys = Keys("wide")
    epoch = PipelineStore(client, keys).ensure_epoch()
    client.set(keys.current, BASE)
    users = [f"u{i:05d}" for i in range(MAX_CHUNK_ROWS)]

    def table(member: str) -> pa.Table:
        return pa.table({VIEW_COL: ["wide"] * len(users), KEY: users, WS: pa.array([None] * len(users), pa.string()),
                         DEPTH: pa.array([1] * len(users), pa.int32()), f"{VALUE}0": ["1.0"] * len(users),
                         **{f"{MEMBER}{j}": [[member]] * len(users) for j in range(4)}})

    for batch_id, member in enumerate(("p", "q")):
        spec = WriteSpec(redis_url, "wide", "q1", epoch, batch_id, 100 * (batch_id + 1), (BASE,),
                         {"wide": measure_spec(view)}, MAX_CHUNK_ROWS, exact_max=0)
        assert apply_rows(spec, table(member), "0", client) == len(users)
    assert client.zscore(keys.segment_scores(BASE, "wide", "count"), users[-1]) == 2.0
    assert client.pfcount(keys.segment_sketch(BASE, "wide", "distinct_m3", users[-1])) == 2
    assert client.scard(keys.segment_undo_copies(BASE, "wide")) == 4 * len(users)


def test_the_realtime_rows_of_a_view_without_scalar_measures_are_listed_and_read(redis_url: str) -> None:
    """Key listings find realtime rows by the segment's rows hash, and a row counts as held by its distinct
    values: a view of distinct measures only is listed, and its keys are read, with exact counts."""
    view = View("tags", keys=("k",), measures=(Distinct("m"),))
    client = redis.Redis.from_url(redis_url)
    keys = Keys("tags")
    epoch = PipelineStore(client, keys).ensure_epoch()
    client.set(keys.current, BASE)
    client.hset(keys.meta(BASE), "measures:tags", json.dumps(row_parts(view)))
    members = {"a|x": ["p", "q"], "b": ["p"], "c": ["r", "s", "t"]}
    table = pa.table({VIEW_COL: ["tags"] * 3, KEY: sorted(members), WS: pa.array([None] * 3, pa.string()),
                      DEPTH: pa.array([1] * 3, pa.int32()), f"{MEMBER}0": [members[k] for k in sorted(members)]})
    spec = WriteSpec(redis_url, "tags", "q1", epoch, 0, 100, (BASE,), {"tags": measure_spec(view)}, 10)
    apply_rows(spec, table, "0", client)
    client.hset(keys.segment_meta(BASE), "processed", 100)

    async def listed_and_one() -> tuple[dict[str, dict], dict]:
        store = ServingStore(redis_url, "tags")
        try:
            page = await page_answer(store, Listing(view, [], "", {}), None, 10)
            one = await key_answer(store, view, "c")
        finally:
            await store.close()
        return {e.key: e.value for e in page.keys}, one.value

    listed, one = asyncio.run(listed_and_one())
    assert listed == {k: {"distinct_m": len(set(m))} for k, m in members.items()}
    assert one == {"distinct_m": 3}
