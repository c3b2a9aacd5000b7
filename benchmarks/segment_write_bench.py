"""What a speed-layer write costs Redis per view row, against the minimal native writes of the same rows.

    .venv/bin/python benchmarks/segment_write_bench.py [--rows 200000 --users 50000 --windows 24 --rounds 3]
    .venv/bin/python benchmarks/segment_write_bench.py --rows 100000 --writes 5    # steady state

No Spark: rows shaped like the payments pipeline's ``spend_by_user_hourly`` increments (a user, an
hour, a count, a sum, a min, a max and one merchant; sorted as the speed layer sorts them) are written
into a fresh realtime segment of the platform's embedded Redis (AOF on, every write fsynced) in three
ways, in rotation, each into a Redis of its own:

* **platform**: ``speed_layer.segments.apply_rows``, the speed layer's own write (chunks of ``--chunk``
  rows): the rows read, merged in Python, and stored by one guarded Lua call per chunk that checks
  they did not change: the row's hash field, its undo entry, per-measure sorted sets.
* **minimal + rankings**: per chunk, the old values read (HMGET) and the new ones written in one
  MULTI/EXEC of native commands: each row one JSON hash field, its undo entry, and one sorted-set
  entry per scalar measure (what top-N merges read) -- the same data a packed layout with client-side
  merging would keep, with no Lua.
* **minimal**: the same without the sorted sets.

For each, Redis's CPU per row (``INFO cpu`` before and after: the scripts, the AOF and the protocol)
and the wall time per row; medians over ``--rounds``, and each minimal write's ratio to the platform's.
With ``--writes N`` each round writes the same rows N times, as N micro-batches updating them (each
starting its undo logs over, so the one before's saved values and sketch copies are dropped): the
last write's figures are a running speed layer's, where the first is a fresh segment's.
Nothing is asserted; figures are printed.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _harness import embedded_redis, git_commit

from serving.store.connection import redis_client, store_keys
from serving.store.session import PipelineStore
from speed_layer import segments

VIEW = "spend_by_user_hourly"
SCALARS = (("count", "count"), ("sum_amount", "sum"), ("min_amount", "min"), ("max_amount", "max"))
DISTINCT = ("distinct_merchant",)
BASE = 2
HOUR0 = 1_767_225_600


def make_rows(n: int, users: int, windows: int, seed: int) -> list[tuple]:
    """``n`` increments (user, window start, amount, merchant), in the speed layer's write order (key, window)."""
    rng = random.Random(seed)
    seen: dict[tuple[str, int], tuple] = {}
    while len(seen) < n:
        user, ws = f"user{rng.randrange(users):06d}", HOUR0 + 3600 * rng.randrange(windows)
        seen[(user, ws)] = (user, ws, round(rng.uniform(1, 500), 2), f"merchant{rng.randrange(400):03d}")
    return sorted(seen.values())


def _platform(client, url: str, rows: list[tuple], chunk: int, batch: int = 0) -> None:
    """``rows`` applied as micro-batch ``batch`` (each a new tag: the one before is committed)."""
    keys = store_keys("payments", url)
    epoch = PipelineStore(client, keys).ensure_epoch()
    client.set(keys.current, BASE)
    amounts = [str(float(a)) for _, _, a, _ in rows]
    table = pa.table({
        segments.VIEW: [VIEW] * len(rows), segments.KEY: [u for u, _, _, _ in rows],
        segments.WS: [str(ws) for _, ws, _, _ in rows], segments.DEPTH: pa.array([1] * len(rows), pa.int32()),
        f"{segments.VALUE}0": ["1.0"] * len(rows), f"{segments.VALUE}1": amounts, f"{segments.VALUE}2": amounts,
        f"{segments.VALUE}3": amounts, f"{segments.MEMBER}0": [[m] for _, _, _, m in rows],
    })
    spec = segments.WriteSpec(url, "payments", "bench", epoch, batch, 10 * (batch + 1), (BASE,),
                              {VIEW: (SCALARS, DISTINCT)}, chunk)
    segments.apply_rows(spec, table, "0", client)


def _minimal(client, url: str, rows: list[tuple], chunk: int, batch: int = 0, *, rankings: bool) -> None:
    keys = store_keys("payments", url)
    view = keys.segment_view_prefix(BASE, VIEW)
    if batch:  # the micro-batch before is committed: its undo logs start over, as the platform's do
        client.delete(*{f"{view}:u@{ws}" for _, ws, _, _ in rows})
    for start in range(0, len(rows), chunk):
        by_window: dict[int, list[tuple]] = {}
        for row in rows[start:start + chunk]:
            by_window.setdefault(row[1], []).append(row)
        read = client.pipeline(transaction=False)
        for ws, group in by_window.items():
            read.hmget(f"{view}:r@{ws}", [u for u, _, _, _ in group])
        olds = read.execute()
        write = client.pipeline(transaction=True)
        for (ws, group), old in zip(by_window.items(), olds):
            write.hset(f"{view}:r@{ws}", mapping={u: json.dumps([1, a, a, a, [m]]) for u, _, a, m in group})
            write.hset(f"{view}:u@{ws}", mapping={u: o or "" for (u, _, _, _), o in zip(group, old)})
            if rankings:
                for name, _ in SCALARS:
                    write.zadd(f"{view}:z:{name}@{ws}", {u: a for u, _, a, _ in group})
        write.hset(keys.guard("bench"), f"{VIEW}:0:{start // chunk}", batch)
        write.execute()


def _measure(write: Callable, rows: list[tuple], chunk: int, writes: int) -> list[tuple[float, float]]:
    """(Redis CPU us per row, wall us per row) of each of ``writes`` consecutive writes of ``rows`` (micro-batches
    updating the same rows) into a fresh embedded Redis."""
    with tempfile.TemporaryDirectory(prefix="segment-write-") as tmp, embedded_redis(Path(tmp) / "redis") as url:
        client = redis_client(url)

        def cpu() -> float:
            info = client.info("cpu")
            return info["used_cpu_user"] + info["used_cpu_sys"]

        figures = []
        for batch in range(writes):
            before, started = cpu(), time.perf_counter()
            write(client, url, rows, chunk, batch)
            wall, used = time.perf_counter() - started, cpu() - before
            figures.append((1e6 * used / len(rows), 1e6 * wall / len(rows)))
        client.close()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000, help="view rows written (default 200,000)")
    parser.add_argument("--users", type=int, default=50_000)
    parser.add_argument("--windows", type=int, default=24, help="hourly windows the rows fall in (default 24)")
    parser.add_argument("--chunk", type=int, default=2_000, help="rows per guarded call (the speed layer's default)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--writes", type=int, default=1,
                        help="consecutive writes of the same rows per round, each a micro-batch updating them (default 1: "
                             "into a fresh segment); the figures are the last write's, each write's printed")
    args = parser.parse_args()
    if min(args.rows, args.users, args.windows, args.chunk, args.rounds, args.writes) < 1:
        parser.error("--rows, --users, --windows, --chunk, --rounds and --writes each take a number of at least 1")
    if args.rows > args.users * args.windows:
        parser.error(f"--rows {args.rows} is more than users x windows ({args.users * args.windows}) distinct rows")
    rows = make_rows(args.rows, args.users, args.windows, seed=5)
    head, dirty = git_commit("speed_layer", "serving")
    print(f"segment writes: {len(rows):,} rows ({args.users:,} users, {args.windows} windows), chunks of {args.chunk}; "
          f"commit {head}{' + uncommitted ' + ', '.join(dirty) if dirty else ''}")
    variants: dict[str, Callable] = {
        "platform (guarded Lua)": _platform,
        "minimal + rankings": lambda c, u, r, k, b: _minimal(c, u, r, k, b, rankings=True),
        "minimal": lambda c, u, r, k, b: _minimal(c, u, r, k, b, rankings=False),
    }
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    wall: dict[str, list[float]] = {name: [] for name in variants}
    for round_ in range(1, args.rounds + 1):
        for name, write in variants.items():
            figures = _measure(write, rows, args.chunk, args.writes)
            redis_us, wall_us = figures[-1]
            cpu[name].append(redis_us)
            wall[name].append(wall_us)
            each = f"   (each write: {', '.join(f'{c:.1f}' for c, _ in figures)})" if args.writes > 1 else ""
            print(f"  round {round_}: {name:<24} Redis CPU {redis_us:6.1f} us/row   wall {wall_us:6.1f} us/row{each}")
    platform = statistics.median(cpu["platform (guarded Lua)"])
    print("\nmedians (Redis CPU per row; ratio to the platform's)")
    for name in variants:
        med = statistics.median(cpu[name])
        print(f"  {name:<24} {med:6.1f} us/row  x{med / platform:4.2f}   wall {statistics.median(wall[name]):6.1f} us/row")


if __name__ == "__main__":
    main()
