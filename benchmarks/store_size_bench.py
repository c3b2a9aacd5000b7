"""Flat with size: key reads and Redis memory per row at 10k, 1M and 10M rows in the served generation.

    .venv/bin/python benchmarks/store_size_bench.py                          # 10k, 1M, 10M rows
    .venv/bin/python benchmarks/store_size_bench.py --rows 10000 1000000 --seconds 3   # quicker

No Spark: for each size a fresh embedded Redis (the platform's, ``deploy.runtime.redis_server``: AOF on)
gets one generation of the wordcount pipeline's ``word_counts`` view (key ``word``, one Count)
written the way ``batch_layer.recompute.publish`` lays a generation out: one hash field per row
holding the row's parts as a JSON array, under ``Keys.rows``, then the store's ``Generations.begin`` /
``flip`` with the generation's record. Key names come from ``serving.store.keys.Keys`` only.

Measured per size:

* memory per row: ``used_memory`` after the generation minus before, divided by the rows; then a
  *minimal HSET* of the same parts (one hash, field = the key, value = the count as plain text,
  no JSON, no generation metadata) in the same Redis, measured the same way. Ratio platform /
  minimal (target <= 1.5). ``MEMORY USAGE`` (sampled) of both hashes is printed alongside.
* key reads through ``ServingStore.read`` (the API's atomic Lua read, in this process, no HTTP):
  random keys over the whole generation, first one read at a time (latency p50/p99 unloaded), then
  ``--concurrency`` reads in flight (reads/s and p99 under load). Every read's count is checked.

Growth 10k -> the largest size is printed for p99 and throughput (target <= 1.2x: p99 may grow at most
1.2x, throughput may fall to no less than 1/1.2). Before reads the benchmark waits for Redis's
AOF rewrite to finish. ``--json PATH`` writes the figures as JSON (``benchmarks/suite.py`` reads it).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _harness import embedded_redis, git_commit, percentile, write_figures

PIPELINE, VIEW, MEASURE = "wordcount", "word_counts", "count"
MINIMAL = "bench:minimal"  # the baseline hash; not a platform key
CHUNK = 1000  # fields per HSET, as the batch loader's default chunk


def _key(i: int) -> str:
    return f"w{i:09d}"


def _count(i: int) -> int:
    return i % 9973 + 1


@dataclass
class SizeFigures:
    rows: int
    load_seconds: float = 0.0
    bytes_per_row: float = 0.0
    minimal_bytes_per_row: float = 0.0
    memory_ratio: float = 0.0
    usage_per_row: float = 0.0
    minimal_usage_per_row: float = 0.0
    seq_p50_ms: float = 0.0
    seq_p99_ms: float = 0.0
    conc_reads_per_s: float = 0.0
    conc_p99_ms: float = 0.0
    redis_us_per_read: float = 0.0
    wrong: int = 0
    rounds: list[dict[str, float]] = field(default_factory=list)


def _used_memory(client: Any) -> int:
    return int(client.info("memory")["used_memory"])


def _redis_cpu(client: Any) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def _settle(client: Any, timeout: float = 600.0) -> None:
    """Wait until Redis has no AOF rewrite or lazy free in progress."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = client.info()
        if not (int(info.get("aof_rewrite_in_progress", 0)) or int(info.get("aof_rewrite_scheduled", 0))
                or int(info.get("lazyfree_pending_objects", 0))):
            return
        time.sleep(0.2)


def _load(client: Any, hash_key: str, rows: int, value: Any) -> None:
    """HSET ``rows`` fields in chunks of CHUNK, ten chunks per pipeline round trip."""
    pipe = client.pipeline(transaction=False)
    for start in range(0, rows, CHUNK):
        flat: list[str] = []
        for i in range(start, min(rows, start + CHUNK)):
            flat += (_key(i), value(i))
        pipe.execute_command("HSET", hash_key, *flat)
        if len(pipe) >= 10:
            pipe.execute()
    pipe.execute()


def publish_generation(client: Any, rows: int, generation: int = 1) -> None:
    """One served generation of ``rows`` rows, laid out as the batch publish lays it out."""
    from serving.store.generation_meta import GenerationMeta
    from serving.store.keys import Keys
    from serving.store.session import PipelineStore

    store = PipelineStore(client, Keys(PIPELINE))
    epoch = store.ensure_epoch()
    store.generations.begin(generation, epoch)
    _load(client, store.keys.rows(generation, VIEW), rows, lambda i: json.dumps([_count(i)], separators=(",", ":")))
    meta = GenerationMeta(run_id="store-size-bench", computed_at=time.time(), events=rows, rows={VIEW: rows},
                          measures={VIEW: [MEASURE]}, integral={VIEW: [MEASURE]})
    if not store.generations.flip(generation, epoch, meta):
        raise SystemExit("the generation was not flipped: is another one served in this Redis?")


def load_size(client: Any, rows: int) -> SizeFigures:
    """Publish the generation, then a minimal HSET of the same parts beside it; memory per row of each."""
    from serving.store.keys import Keys

    _settle(client)
    before = _used_memory(client)
    started = time.perf_counter()
    publish_generation(client, rows)
    load_seconds = time.perf_counter() - started
    _settle(client)
    platform = _used_memory(client) - before
    _load(client, MINIMAL, rows, lambda i: str(_count(i)))
    _settle(client)
    minimal = _used_memory(client) - before - platform
    usage = int(client.memory_usage(Keys(PIPELINE).rows(1, VIEW), samples=5000) or 0)
    minimal_usage = int(client.memory_usage(MINIMAL, samples=5000) or 0)
    client.unlink(MINIMAL)
    _settle(client)
    return SizeFigures(rows, load_seconds, platform / rows, minimal / rows,
                       platform / minimal if minimal > 0 else float("nan"), usage / rows, minimal_usage / rows)


async def _reads(url: str, rows: int, seconds: float, concurrency: int, seed: int,
                 cpu: Callable[[], float]) -> tuple[list[float], int, float, float]:
    """Random-key reads through ServingStore.read for ``seconds`` after a 1 s warm-up at the same
    concurrency; (latencies s, wrong answers, wall s, ``cpu()`` seconds over the timed part)."""
    from serving.store.reader import ServingStore

    store = ServingStore(url, PIPELINE)
    rng = random.Random(seed)
    latencies: list[float] = []
    wrong = 0

    async def reader(deadline: float) -> None:
        nonlocal wrong
        while time.perf_counter() < deadline:
            i = rng.randrange(rows)
            t0 = time.perf_counter()
            got = await store.read(VIEW, [(_key(i), None)], [MEASURE], [])
            latencies.append(time.perf_counter() - t0)
            if got.batch[0][MEASURE] != _count(i):
                wrong += 1

    try:
        warm = time.perf_counter() + 1.0
        await asyncio.gather(*(reader(warm) for _ in range(concurrency)))
        latencies.clear()
        cpu0, started = cpu(), time.perf_counter()
        await asyncio.gather(*(reader(started + seconds) for _ in range(concurrency)))
        return latencies, wrong, time.perf_counter() - started, cpu() - cpu0
    finally:
        await store.close()


def _run_reads(url: str, rows: int, seconds: float, concurrency: int,
               cpu: Callable[[], float]) -> tuple[list[float], int, float, float]:
    reads = _reads(url, rows, seconds, concurrency, rows, cpu)
    try:
        import uvloop  # the API server's loop
    except ImportError:
        return asyncio.run(reads)
    return uvloop.run(reads)


def read_round(client: Any, url: str, size: SizeFigures, seconds: float, concurrency: int) -> dict[str, float]:
    """One read round on one size: one read in flight, then ``concurrency`` (with Redis CPU per read)."""
    cpu = functools.partial(_redis_cpu, client)
    seq, wrong_seq, _, _ = _run_reads(url, size.rows, seconds, 1, cpu)
    conc, wrong_conc, wall, redis_cpu = _run_reads(url, size.rows, seconds, concurrency, cpu)
    size.wrong += wrong_seq + wrong_conc
    return {"seq_p50_ms": percentile(seq, 0.5) * 1e3, "seq_p99_ms": percentile(seq, 0.99) * 1e3,
            "conc_reads_per_s": len(conc) / wall, "conc_p99_ms": percentile(conc, 0.99) * 1e3,
            "redis_us_per_read": redis_cpu / len(conc) * 1e6}


def measure(rows: list[int], root: Path, seconds: float, concurrency: int, rounds: int) -> list[SizeFigures]:
    """Load every size into its own Redis, then ``rounds`` of reads rotating over the sizes (drift hits each alike)."""
    from serving.store.connection import redis_client

    sizes: list[SizeFigures] = []
    with ExitStack() as stack:
        urls, clients = [], []
        for n in sorted(rows):
            url = stack.enter_context(embedded_redis(root / f"redis-{n}"))
            client = redis_client(url)
            stack.callback(client.close)
            size = load_size(client, n)
            sizes.append(size)
            urls.append(url)
            clients.append(client)
            print(f"  {size.rows:>11,} rows: loaded in {size.load_seconds:6.1f} s; memory/row {size.bytes_per_row:6.1f} B"
                  f" vs minimal HSET {size.minimal_bytes_per_row:6.1f} B = x{size.memory_ratio:.2f} (MEMORY USAGE "
                  f"{size.usage_per_row:.1f} vs {size.minimal_usage_per_row:.1f} B)", flush=True)
        for r in range(1, rounds + 1):
            for size, url, client in zip(sizes, urls, clients):
                got = read_round(client, url, size, seconds, concurrency)
                size.rounds.append(got)
                print(f"  round {r} {size.rows:>11,} rows: 1 in flight p50 {got['seq_p50_ms']:.3f} p99 "
                      f"{got['seq_p99_ms']:.3f} ms; {concurrency} in flight {got['conc_reads_per_s']:,.0f} reads/s "
                      f"p99 {got['conc_p99_ms']:.3f} ms, Redis {got['redis_us_per_read']:.1f} us CPU/read", flush=True)
    for size in sizes:
        for name in ("seq_p50_ms", "seq_p99_ms", "conc_reads_per_s", "conc_p99_ms", "redis_us_per_read"):
            setattr(size, name, statistics.median(got[name] for got in size.rounds))
    return sizes


def growth(sizes: list[SizeFigures]) -> dict[str, float]:
    """Largest size against the smallest: p99 growth (unloaded and loaded) and throughput loss (small/large)."""
    small, large = sizes[0], sizes[-1]
    return {"from_rows": small.rows, "to_rows": large.rows,
            "seq_p99_growth": large.seq_p99_ms / small.seq_p99_ms,
            "conc_p99_growth": large.conc_p99_ms / small.conc_p99_ms,
            "throughput_loss": small.conc_reads_per_s / large.conc_reads_per_s,
            "redis_cpu_growth": large.redis_us_per_read / small.redis_us_per_read,
            "worst_memory_ratio": max(s.memory_ratio for s in sizes)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[10_000, 1_000_000, 10_000_000],
                        help="rows in the served generation, one fresh Redis each (default 10k 1M 10M)")
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each read phase (default 5)")
    parser.add_argument("--concurrency", type=int, default=16, help="reads in flight in the loaded phase")
    parser.add_argument("--rounds", type=int, default=2, help="read rounds over all sizes in rotation (medians)")
    parser.add_argument("--json", type=Path, default=None, help="write the figures to this JSON file")
    args = parser.parse_args(argv)
    head, changed = git_commit("serving", "batch_layer")
    print(f"store size benchmark: {PIPELINE}/{VIEW}, rows {args.rows}; commit {head}"
          + (f" + uncommitted {', '.join(changed)}" if changed else ""), flush=True)
    with tempfile.TemporaryDirectory(prefix="store-size-bench-") as tmp:
        sizes = measure(args.rows, Path(tmp), args.seconds, args.concurrency, args.rounds)
    for s in sizes:
        if s.wrong:
            print(f"  WRONG ANSWERS at {s.rows:,} rows: {s.wrong}")
    g = growth(sizes)
    print(f"  growth {g['from_rows']:,} -> {g['to_rows']:,} rows: p99 x{g['seq_p99_growth']:.2f} (1 in flight), "
          f"x{g['conc_p99_growth']:.2f} ({args.concurrency} in flight); throughput fell x{g['throughput_loss']:.2f}; "
          f"Redis CPU per read x{g['redis_cpu_growth']:.2f} "
          f"(target <= 1.2); memory per row vs minimal HSET at worst x{g['worst_memory_ratio']:.2f} (target <= 1.5)")
    if args.json:
        write_figures(args.json, "store_size", {"sizes": [asdict(s) for s in sizes], "growth": g,
                                                "concurrency": args.concurrency, "rounds": args.rounds,
                                                "cpus": os.cpu_count()})
    return 1 if any(s.wrong for s in sizes) else 0


if __name__ == "__main__":
    raise SystemExit(main())
