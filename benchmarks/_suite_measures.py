"""The suite's benchmarks (quick and full arguments) and the issue's targets, each read from the JSON
figures a benchmark writes with ``--json`` (never from its printed text)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Figures = dict[str, Any]


@dataclass(frozen=True)
class Bench:
    """One benchmark run of the suite: a script with its quick and full arguments (``--json`` is added)."""

    name: str
    script: str
    quick: tuple[str, ...]
    full: tuple[str, ...]
    timeout: float  # seconds, quick profile; the full profile gets 20x

    def argv(self, full: bool) -> list[str]:
        return [self.script, *(self.full if full else self.quick)]


BENCHES = (
    Bench("cluster_store", "benchmarks/cluster_store_bench.py",
          ("--events", "100000", "--versions", "10", "--repeat", "1", "--read-seconds", "3"),
          ("--events", "2000000", "--versions", "200", "--repeat", "2", "--read-seconds", "10"), 420),
    Bench("query", "benchmarks/query_bench.py",
          ("--rounds", "1", "--seconds", "5", "--warmup", "2", "--no-profile", "--quiet-timeout", "5"),
          ("--no-profile",), 300),
    Bench("batch", "benchmarks/batch_recompute.py",
          ("--events", "1000000", "--repeat", "1", "--driver-memory", "4g", "--quiet-timeout", "5", "--no-verify"),
          ("--events", "1000000", "10000000", "--repeat", "2", "--driver-memory", "8g"), 600),
    Bench("speed_50k", "benchmarks/speed_layer_bench.py",
          ("throughput", "--events", "200000", "--versions", "20", "--users", "50000"),
          ("throughput", "--events", "2000000", "--versions", "200", "--users", "50000"), 480),
    Bench("speed_1k", "benchmarks/speed_layer_bench.py",
          ("throughput", "--events", "200000", "--versions", "20", "--users", "1000", "--max-rows", "50000"),
          ("throughput", "--events", "2000000", "--versions", "200", "--users", "1000"), 420),
    Bench("freshness", "benchmarks/speed_layer_bench.py",
          ("freshness", "--events", "40", "--rate", "4", "--idle-seconds", "5"),
          ("freshness", "--events", "240", "--rate", "4", "--idle-seconds", "30"), 300),
    Bench("ingest", "benchmarks/ingest_bench.py",
          ("--requests", "3000", "--clients", "64", "--batches", "20", "--batch-clients", "4", "--rounds", "1",
           "--quiet-timeout", "5"),
          (), 240),
    Bench("top_merge", "benchmarks/top_merge_bench.py",
          ("--batch", "50000", "--realtime", "1000", "50000", "--repeat", "1", "--seconds", "2"),
          ("--batch", "1000000", "--realtime", "1000", "10000", "50000", "--cluster"), 240),
    Bench("store_size", "benchmarks/store_size_bench.py",
          ("--rows", "10000", "1000000", "--seconds", "2", "--rounds", "3"),
          ("--rows", "10000", "1000000", "10000000", "--seconds", "5"), 300),
)


@dataclass(frozen=True)
class Outcome:
    figure: str
    met: bool | None  # None: measured, but no pass/fail (or only part of it)
    note: str = ""


@dataclass(frozen=True)
class Measure:
    """One row of the table: what, the target, which benchmark's figures, how to read them."""

    measure: str
    target: str
    bench: str | None  # None: no benchmark exists yet
    read: Callable[[Figures], Outcome | None] | None = None  # None from read(): not in this run's figures
    command: str = ""  # what would measure it, shown when it is not measured


def _top_merge(f: Figures) -> Outcome | None:
    one = f.get("one Redis")
    if not one or len(one) < 2:
        return None
    sizes = sorted(one, key=int)
    small, large = one[sizes[0]], one[sizes[-1]]
    return Outcome(f"{large['threshold'] / large['every_row']:.1f}x at {int(sizes[-1]):,} realtime rows "
                   f"({large['threshold']:,.0f} vs {large['every_row']:,.0f} top-10/s); threshold top-10/s "
                   f"{int(sizes[0]):,} -> {int(sizes[-1]):,} rows: {large['threshold'] / small['threshold']:.2f}x", None)


def _cluster(figure: str, unit: str) -> Callable[[Figures], Outcome | None]:
    def read(f: Figures) -> Outcome | None:
        x = f.get(figure)
        if x is None:
            return None
        return Outcome(f"{x['ratio']:.2f}x ({x['cluster']:,.0f} vs {x['one']:,.0f} {unit}; 2 cores shared)", None)

    return read


def _events(n: float) -> str:
    n = int(n)
    return f"{n // 1_000_000}M" if n % 1_000_000 == 0 else f"{n // 1000}k" if n % 1000 == 0 else f"{n:,}"


def _batch_at(events: int) -> Callable[[Figures], Outcome | None]:
    def read(f: Figures) -> Outcome | None:
        size = next((s for s in f["sizes"] if s["events"] == events), None)
        if size is None:
            return None
        return Outcome(f"{size['a_over_b']:.2f}x ({size['a_seconds']:.1f} s vs {size['b_seconds']:.1f} s; "
                       f"by CPU {size['a_over_b_cpu']:.2f}x)", size["a_over_b"] <= 1.15)
    return read


def _batch_growth(f: Figures) -> Outcome | None:
    sizes = {s["events"]: s for s in f["sizes"]}
    if 1_000_000 not in sizes or 10_000_000 not in sizes:
        return None
    ratio = sizes[10_000_000]["a_seconds"] / sizes[1_000_000]["a_seconds"]
    return Outcome(f"{ratio:.1f}x ({sizes[10_000_000]['a_seconds']:.1f} s / {sizes[1_000_000]['a_seconds']:.1f} s)",
                   ratio <= 11)


def _speed_rate(f: Figures) -> Outcome:
    return Outcome(f"{f['events_per_s']:,.0f} events/s ({_events(f['events'])} events, {f['users']:,} users)",
                   f["events_per_s"] >= 100_000)


def _speed_ratio(f: Figures) -> Outcome:
    """Judged on the sustained rate (after the first micro-batch) where the run had more than one."""
    ratio = f["events_per_s"] / f["baseline_events_per_s"]
    sustained = f.get("sustained_events_per_s")
    if not sustained:
        return Outcome(f"{ratio:.2f}x ({f['events_per_s']:,.0f} vs {f['baseline_events_per_s']:,.0f} events/s, "
                       f"{_events(f['events'])} events, start included)", ratio >= 0.7)
    kept = sustained / f["baseline_events_per_s"]
    return Outcome(f"sustained {kept:.2f}x ({sustained:,.0f} vs {f['baseline_events_per_s']:,.0f} events/s; "
                   f"{ratio:.2f}x with the start, {_events(f['events'])} events)", kept >= 0.7)


def _speed_peer(f: Figures) -> Outcome | None:
    """Ours / the foreachBatch peer (pipelined increments, at-least-once), on the sustained rates where both have one."""
    peer = f.get("peer_events_per_s")
    if not peer:
        return None
    kept, sustained, peer_kept = f.get("ours_over_peer_sustained"), f.get("sustained_events_per_s"), f.get("peer_sustained_events_per_s")
    head = (f"sustained {kept:.2f}x ({sustained:,.0f} vs {peer_kept:,.0f} events/s); " if kept else "")
    return Outcome(head + f"{f['ours_over_peer']:.2f}x with the start ({f['events_per_s']:,.0f} vs {peer:,.0f} events/s, "
                   f"{_events(f['events'])} events, {f['users']:,} users; peer median of {len(f['peer_runs'])})", None)


def _batch_peer(f: Figures) -> Outcome | None:
    size = next((s for s in f["sizes"] if s["events"] == 1_000_000 and "a_over_d" in s), None)
    if size is None:
        return None
    return Outcome(f"{size['a_over_d']:.2f}x ({size['a_seconds']:.1f} s vs {size['d_seconds']:.1f} s; "
                   f"by CPU {size['a_over_d_cpu']:.2f}x)", None)


def _p99_ratio(f: Figures) -> Outcome:
    ratio = f.get("p99_a_over_b", f["a_p99_ms"] / f["b_p99_ms"])
    return Outcome(f"{ratio:.2f}x ({f['a_p99_ms']:.2f} vs {f['b_p99_ms']:.2f} ms at {f['half_rate']:,.0f} req/s)", None)


def _sizes(f: Figures) -> str:
    g = f["growth"]
    return f"{_events(g['from_rows'])} -> {_events(g['to_rows'])} rows"


def _partial(f: Figures, ok: bool) -> tuple[bool, str]:
    """Met or not over the sizes measured, and a note when the largest was below 10M rows."""
    largest = f["growth"]["to_rows"]
    if largest >= 10_000_000:
        return ok, ""
    return ok, f"up to {_events(largest)} rows only; 10M: python benchmarks/store_size_bench.py"


def _flat_p99(f: Figures) -> Outcome:
    g, small, large = f["growth"], f["sizes"][0], f["sizes"][-1]
    met, note = _partial(f, g["conc_p99_growth"] <= 1.2)
    return Outcome(f"{g['conc_p99_growth']:.2f}x ({small['conc_p99_ms']:.2f} -> {large['conc_p99_ms']:.2f} ms, "
                   f"{f['concurrency']} in flight; 1 in flight {g['seq_p99_growth']:.2f}x), {_sizes(f)}", met, note)


def _flat_throughput(f: Figures) -> Outcome:
    g, small, large = f["growth"], f["sizes"][0], f["sizes"][-1]
    met, note = _partial(f, g["throughput_loss"] <= 1.2)
    return Outcome(f"{g['throughput_loss']:.2f}x ({small['conc_reads_per_s']:,.0f} -> {large['conc_reads_per_s']:,.0f} "
                   f"reads/s; Redis CPU per read {small['redis_us_per_read']:.0f} -> {large['redis_us_per_read']:.0f} us), "
                   f"{_sizes(f)}", met, note)


def _memory(f: Figures) -> Outcome:
    worst = max(f["sizes"], key=lambda s: s["memory_ratio"])
    return Outcome(f"{worst['memory_ratio']:.2f}x ({worst['bytes_per_row']:.0f} vs {worst['minimal_bytes_per_row']:.0f} "
                   f"B/row at {_events(worst['rows'])} rows)", worst["memory_ratio"] <= 1.5)


FULL_BATCH = "python benchmarks/batch_recompute.py --events 1000000 10000000 --repeat 2 (or suite.py --full)"
MEASURES = (
    Measure("key reads: platform / bare FastAPI + HGET throughput", ">= 0.8x", "query",
            lambda f: Outcome(f"{f['a_over_b']:.2f}x ({f['a_rps']:,.0f} vs {f['b_rps']:,.0f} req/s; server CPU "
                              f"{f['a_cpu_us']:.0f} vs {f['b_cpu_us']:.0f} us/req)", f["a_over_b"] >= 0.8)),
    Measure("key reads: p99 at half saturation", "<= 3 ms", "query",
            lambda f: Outcome(f"{f['a_p99_ms']:.2f} ms (at {f['half_rate']:,.0f} req/s; bare {f['b_p99_ms']:.2f} ms)",
                              f["a_p99_ms"] <= 3.0)),
    Measure("key reads: p99 at half saturation / bare endpoint's p99 at the same rate", "reported", "query",
            _p99_ratio),
    Measure("batch recompute incl. Redis publish / hand-written Spark SQL, 1M events", "<= 1.15x", "batch",
            _batch_at(1_000_000), FULL_BATCH),
    Measure("batch recompute / peer (Spark SQL -> Redis, HSET pipelines, no generations), 1M events", "reported",
            "batch", _batch_peer, FULL_BATCH),
    Measure("batch recompute / hand-written Spark SQL, 10M events", "<= 1.15x", "batch", _batch_at(10_000_000),
            FULL_BATCH),
    Measure("batch recompute time 10M / 1M events", "<= 11x", "batch", _batch_growth, FULL_BATCH),
    Measure("speed layer throughput, 50k users", ">= 100k events/s", "speed_50k", _speed_rate),
    Measure("speed layer / Spark baseline, 1k users", ">= 0.7x", "speed_1k", _speed_ratio),
    Measure("speed layer / foreachBatch peer (pipelined HINCRBY/PFADD, at-least-once), 50k users", "reported",
            "speed_50k", _speed_peer),
    Measure("speed layer / foreachBatch peer (pipelined HINCRBY/PFADD, at-least-once), 1k users", "reported",
            "speed_1k", _speed_peer),
    Measure("freshness: ingest -> merged answer, p95", "<= 0.5 s", "freshness",
            lambda f: Outcome(f"{f['p95_s']:.3f} s (p50 {f['p50_s']:.3f}, max {f['max_s']:.3f}; {f['events']} events, "
                              f"trigger {f['trigger_s']:g} s; after {f.get('warmup_events', 0)} warm-up events, the first visible "
                              f"{f.get('first_answer_s', float('nan')):.1f} s after start)", f["p95_s"] <= 0.5)),
    Measure("idle speed layer CPU (process, JVM, workers)", "no busy loop (< 0.1 cores)", "freshness",
            lambda f: Outcome(f"{f['idle_cores']:.3f} cores over {f['idle_seconds']:g} s", f["idle_cores"] < 0.1)),
    Measure("flat with size: key-read p99 growth", "<= 1.2x, 10k -> 10M rows", "store_size", _flat_p99,
            "python benchmarks/store_size_bench.py --rows 10000 1000000 10000000"),
    Measure("flat with size: key-read throughput loss", "<= 1.2x, 10k -> 10M rows", "store_size", _flat_throughput,
            "python benchmarks/store_size_bench.py --rows 10000 1000000 10000000"),
    Measure("Redis memory per row / minimal HSET of the same parts", "<= 1.5x", "store_size", _memory),
    Measure("HTTP ingest: single-event POSTs, 64 connections", ">= 2,000 req/s", "ingest",
            lambda f: Outcome(f"{f['single']['64']:,.0f} req/s" + ("" if f["exact"] else "; MASTER MISMATCH"),
                              f["single"]["64"] >= 2000 and f["exact"])),
    Measure("HTTP ingest: batched POSTs / raw delta-rs appends, 4 connections", ">= 0.5x", "ingest",
            lambda f: Outcome(f"{f['batched']['4']:.2f}x", f["batched"]["4"] >= 0.5 and f["exact"])),
    Measure("Redis Cluster 3 masters / 1: speed-layer throughput", "reported", "cluster_store",
            _cluster("events/s", "events/s")),
    Measure("Redis Cluster 3 masters / 1: key-read throughput (Lua read, no HTTP)", "reported", "cluster_store",
            _cluster("reads/s", "reads/s")),
    Measure("Redis Cluster 3 masters / 1: top-10 (every bucket in one pipeline, merged)", "reported",
            "cluster_store", _cluster("top/s", "top-10/s")),
    Measure("top-10 with a large realtime segment: threshold merge / every realtime row", "reported", "top_merge",
            _top_merge),
)
