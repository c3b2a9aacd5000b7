"""HTTP ingest benchmark: POST /v1/events against raw delta-rs appends of the same events, same run.

    python benchmarks/ingest_bench.py                                   # defaults below, 2 rounds
    python benchmarks/ingest_bench.py --requests 5000 --batches 50 --rounds 1   # quicker

The API runs as in production: ``python -m deploy.cli serve`` in its own process (uvicorn, one
worker), on a fresh data dir, with an embedded Redis (``deploy.runtime.redis_server.ensure_embedded_redis``),
the payments pipeline and an API key (``LAMBDA_API_KEYS``; every request sends
``Authorization: Bearer benchkey``). The clients run in this process: a minimal asyncio HTTP/1.1
client over keep-alive connections (so the client costs little of the machine's CPU), each
connection sending its next request when the answer to the last one arrived (a closed loop:
N connections = N requests in flight). Requests are built before the clock starts.

Phases, in rotation for ``--rounds`` rounds:

A. single events: ``--requests`` POSTs of one event each (a JSON object), once per client count
   in ``--clients`` (default 64 and 256 connections). Target: >= 2,000 requests/s. Group commit
   makes concurrent requests share Delta commits, so requests per commit, and with it the rate,
   grows with the number of requests in flight.
B. batches: ``--batches`` POSTs of ``--batch-size`` events each (a JSON array), once per client
   count in ``--batch-clients``.
C. baseline: raw delta-rs appends of B's events, already as Arrow tables in master layout
   (validated and converted before the clock starts), one ``write_deltalake`` per batch of
   ``--batch-size``, one after the other, on a kept DeltaTable handle (opened anew after each
   checkpoint: a handle kept across many commits gets slower with each), in this process, to a
   second table with the master dataset's schema and settings. Target: B >= half of C's events/s.

For every phase: requests/s and events/s, client-side latency p50/p99, Delta commits made (and
so requests per commit), CPU of the server process (microseconds per request), and the cores
other processes on the machine used meanwhile (this benchmark's client excluded). Before each
phase it waits (up to ``--quiet-timeout`` s) until other processes use less than
``--quiet-cores`` cores; on a shared machine take the rates as indicative and the server's CPU
per request as the steadier figure. After the runs the master dataset is checked to hold every
acknowledged event exactly once. Nothing is asserted; figures are printed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _harness import (
    cpu_seconds,
    free_port,
    git_commit,
    machine_busy_seconds,
    percentile,
    stop,
    wait_quiet,
    wait_up,
    write_figures,
)

from batch_layer.master.engines import get_engine
from deploy.runtime.redis_server import ensure_embedded_redis, stop_embedded_redis
from deploy.settings import load_settings
from shared_logic.registry import load_pipeline

API_KEY = "benchkey-0123456789"
PIPELINE = "payments"


@dataclass
class Phase:
    name: str
    requests: int
    events: int
    seconds: float
    latencies: list[float]
    commits: int
    server_cpu: float | None
    others_cores: float
    failures: int

    @property
    def rps(self) -> float:
        return self.requests / self.seconds

    @property
    def eps(self) -> float:
        return self.events / self.seconds

    def line(self) -> str:
        lat = self.latencies or [0.0]
        p50, p99 = percentile(lat, 0.5), percentile(lat, 0.99)
        per_commit = f"{self.requests / self.commits:6.1f} req/commit" if self.commits else ""
        cpu = f"server {self.server_cpu / self.requests * 1e6:6.0f} us CPU/req" if self.server_cpu is not None else " " * 26
        return (f"{self.name:<24} {self.rps:7,.0f} req/s {self.eps:9,.0f} events/s"
                f"  p50 {p50 * 1e3:6.1f} ms p99 {p99 * 1e3:6.1f} ms  {self.commits:4d} commits {per_commit}"
                f"  {cpu}  others {self.others_cores:.2f} cores{f'  FAILURES {self.failures}' if self.failures else ''}")


def event(i: int) -> dict[str, object]:
    return {"user_id": f"user-{i % 50_000}", "merchant": f"m-{i % 200}", "amount": round(1 + (i * 7919 % 50_000) / 100, 2),
            "event_time": f"2026-01-01T{(i // 3600) % 24:02d}:{(i // 60) % 60:02d}:{i % 60:02d}Z"}


def http_request(port: int, body: bytes) -> bytes:
    head = (f"POST /v1/events HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {API_KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")
    return head.encode() + body


async def _drive(port: int, requests: list[bytes], clients: int) -> tuple[float, list[float], int]:
    """Send ``requests`` over ``clients`` keep-alive connections; (seconds, latencies, non-202 answers)."""
    latencies: list[float] = []
    failures = 0
    pending = iter(requests)

    async def client() -> None:
        nonlocal failures
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            for request in pending:
                start = time.perf_counter()
                writer.write(request)
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    if line[:15].lower() == b"content-length:":
                        length = int(line[15:])
                body = await reader.readexactly(length)
                latencies.append(time.perf_counter() - start)
                if head[9:12] != b"202":
                    failures += 1
                    if failures <= 3:
                        print(f"  ! {head[:12].decode()} {body[:200].decode(errors='replace')}")
        finally:
            writer.close()

    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    return time.perf_counter() - start, latencies, failures


class Machine:
    """CPU used by the server process and by everything else (this process excluded)."""

    def __init__(self, server: psutil.Process) -> None:
        self.server, self.me = server, psutil.Process()

    def sample(self) -> tuple[float, float, float, float]:
        return time.perf_counter(), machine_busy_seconds(), cpu_seconds(self.server), cpu_seconds(self.me)

    @staticmethod
    def others_cores(before: tuple[float, float, float, float], after: tuple[float, float, float, float]) -> float:
        wall = after[0] - before[0]
        others = (after[1] - before[1]) - (after[2] - before[2]) - (after[3] - before[3])
        return max(0.0, others / wall) if wall > 0 else 0.0

    def wait_quiet(self, cores: float, timeout: float) -> None:
        wait_quiet(lambda: cpu_seconds(self.server) + cpu_seconds(self.me), cores, timeout)


def measure(machine: Machine, name: str, requests: int, events: int, master: Path | None,
            run: Callable[[], tuple[float, list[float], int]], *, server: bool) -> Phase:
    before_version = DeltaTable(str(master)).version() if master else 0
    before = machine.sample()
    seconds, latencies, failures = run()
    after = machine.sample()
    commits = DeltaTable(str(master)).version() - before_version if master else requests
    return Phase(name, requests, events, seconds, latencies, commits, after[2] - before[2] if server else None,
                 machine.others_cores(before, after), failures)


def raw_appends(path: Path, tables: list[pa.Table]) -> tuple[float, list[float], int]:
    table = DeltaTable(str(path))
    latencies = []
    start = time.perf_counter()
    for t in tables:
        s = time.perf_counter()
        write_deltalake(table, t, mode="append")
        if table.version() % 100 == 0:  # a checkpoint was just written: start a handle from it
            table = DeltaTable(str(path))
        latencies.append(time.perf_counter() - s)
    return time.perf_counter() - start, latencies, 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=20_000, help="single-event POSTs per round and client count")
    parser.add_argument("--clients", default="64,256", help="concurrent connections for single events (list)")
    parser.add_argument("--batches", type=int, default=200, help="batched POSTs per round and client count")
    parser.add_argument("--batch-size", type=int, default=1000, help="events per batched POST")
    parser.add_argument("--batch-clients", default="4,8", help="concurrent connections for batches (list)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--group-commit-ms", type=float, default=None,
                        help="LAMBDA_INGEST_GROUP_COMMIT_MS for the server (default: the settings' default)")
    parser.add_argument("--quiet-cores", type=float, default=0.5, help="wait until other processes use fewer cores")
    parser.add_argument("--quiet-timeout", type=float, default=60.0)
    parser.add_argument("--data-dir", type=Path, default=None, help="keep the data here (default: a temp dir)")
    parser.add_argument("--json", type=Path, default=None, help="write the figures to this JSON file (for suite.py)")
    args = parser.parse_args()
    clients = [int(c) for c in args.clients.split(",")]
    batch_clients = [int(c) for c in args.batch_clients.split(",")]

    tmp = None if args.data_dir else tempfile.TemporaryDirectory(prefix="ingest-bench-")
    data_dir = (args.data_dir or Path(tmp.name)).resolve()  # type: ignore[union-attr]
    data_dir.mkdir(parents=True, exist_ok=True)
    settings = load_settings(data_dir=data_dir, pipeline=PIPELINE)
    pipeline = load_pipeline(PIPELINE)
    redis_url = ensure_embedded_redis(settings.redis_dir)
    port = free_port()
    env = {**os.environ, "LAMBDA_DATA_DIR": str(data_dir), "LAMBDA_PIPELINE": PIPELINE, "LAMBDA_REDIS_URL": redis_url,
           "LAMBDA_HTTP_PORT": str(port), "LAMBDA_API_KEYS": json.dumps({API_KEY: ["read", "ingest", "admin"]})}
    if args.group_commit_ms is not None:
        env["LAMBDA_INGEST_GROUP_COMMIT_MS"] = str(args.group_commit_ms)
    group_ms = args.group_commit_ms if args.group_commit_ms is not None else settings.ingest_group_commit_ms

    # the raw baseline's table: the master dataset's schema and table settings
    raw_path = data_dir / "raw_baseline"
    get_engine("delta-rs").ensure_table(raw_path, pipeline.schema.arrow_schema(), name="raw_baseline", change_feed=True)

    server_log = (data_dir / "server.log").open("wb")
    server = subprocess.Popen([sys.executable, "-m", "deploy.cli", "serve"], env=env, cwd=Path(__file__).parents[1],
                              stdout=server_log, stderr=subprocess.STDOUT)
    try:
        wait_up(f"http://127.0.0.1:{port}/healthz", server, data_dir / "server.log", timeout=60)
        machine = Machine(psutil.Process(server.pid))
        print(f"ingest benchmark: pipeline {PIPELINE}; server `python -m deploy.cli serve` (uvicorn, 1 process); "
              f"group commit {group_ms:g} ms; {os.cpu_count()} cores; commit {_commit()}")
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60,
                          headers={"Authorization": f"Bearer {API_KEY}"}) as http:
            for i in range(20):  # warm-up: creates the master table, first commits
                r = http.post("/v1/events", json=[event(-1 - i)])
                if r.status_code != 202:
                    raise SystemExit(f"warm-up POST failed: {r.status_code} {r.text}")
        acked, next_id = 20, 0
        phases: dict[str, list[Phase]] = {}

        def record(phase: Phase, rnd: int) -> None:
            phases.setdefault(phase.name, []).append(phase)
            print(f"round {rnd}: {phase.line()}", flush=True)

        for rnd in range(1, args.rounds + 1):
            for c in clients:
                bodies = [json.dumps(event(next_id + i)).encode() for i in range(args.requests)]
                next_id += args.requests
                requests = [http_request(port, b) for b in bodies]
                machine.wait_quiet(args.quiet_cores, args.quiet_timeout)
                phase = measure(machine, f"A 1 event   x{c} conn", len(requests), len(requests), settings.master_path,
                                lambda r=requests, c=c: asyncio.run(_drive(port, r, c)), server=True)
                acked += 0 if phase.failures else phase.events
                record(phase, rnd)
            for c in batch_clients:
                events = [[event(next_id + b * args.batch_size + i) for i in range(args.batch_size)]
                          for b in range(args.batches)]
                next_id += args.batches * args.batch_size
                requests = [http_request(port, json.dumps(batch).encode()) for batch in events]
                tables = [pipeline.schema.validate(batch) for batch in events]
                n = args.batches * args.batch_size
                machine.wait_quiet(args.quiet_cores, args.quiet_timeout)
                phase = measure(machine, f"B {args.batch_size} events x{c} conn", len(requests), n,
                                settings.master_path, lambda r=requests, c=c: asyncio.run(_drive(port, r, c)), server=True)
                acked += 0 if phase.failures else phase.events
                record(phase, rnd)
                machine.wait_quiet(args.quiet_cores, args.quiet_timeout)
                record(measure(machine, f"C raw delta-rs (B x{c})", len(tables), n, raw_path,
                               lambda t=tables: raw_appends(raw_path, t), server=False), rnd)

        print("\nmedians over rounds:")
        for name, ps in phases.items():
            cpu = [p.server_cpu / p.requests * 1e6 for p in ps if p.server_cpu is not None]
            print(f"  {name:<24} {statistics.median(p.rps for p in ps):7,.0f} req/s "
                  f"{statistics.median(p.eps for p in ps):9,.0f} events/s"
                  + (f"  server {statistics.median(cpu):5.0f} us CPU/req" if cpu else ""))
        print()
        figures: dict[str, dict[str, float]] = {"single": {}, "batched": {}}
        for c in clients:
            rps = statistics.median(p.rps for p in phases[f"A 1 event   x{c} conn"])
            figures["single"][str(c)] = rps
            print(f"single-event POSTs, {c:3d} connections: {rps:7,.0f} requests/s   (target >= 2,000)")
        for c in batch_clients:
            b = statistics.median(p.eps for p in phases[f"B {args.batch_size} events x{c} conn"])
            raw = statistics.median(p.eps for p in phases[f"C raw delta-rs (B x{c})"])
            figures["batched"][str(c)] = b / raw
            print(f"batched POSTs, {c:2d} connections / raw delta-rs appends: {b:9,.0f} / {raw:9,.0f} events/s "
                  f"= {b / raw:.2f}   (target >= 0.50)")

        table = DeltaTable(str(settings.master_path)).to_pyarrow_table(columns=["_kind"])
        in_master = sum(1 for kind in table.column("_kind").to_pylist() if kind == "event")
        verdict = "exactly" if in_master == acked else "MISMATCH with"
        print(f"master dataset: {in_master:,} event rows, {verdict} the {acked:,} acknowledged events; "
              f"{DeltaTable(str(settings.master_path)).version()} versions")
        if args.json:
            write_figures(args.json, "ingest", {**figures, "exact": in_master == acked, "requests": args.requests,
                                                "batches": args.batches, "batch_size": args.batch_size})
    finally:
        stop(server, timeout=30)
        server_log.close()
        stop_embedded_redis(settings.redis_dir)
        if tmp is not None:
            tmp.cleanup()


def _commit() -> str:
    head, changed = git_commit("serving", "batch_layer")
    return head + (f" + uncommitted {', '.join(changed)}" if changed else "")


if __name__ == "__main__":
    main()
