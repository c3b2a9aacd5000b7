"""Query benchmark: GET /v1/views/{view}/keys/{key} against a bare FastAPI endpoint doing one Redis read.

    .venv/bin/python benchmarks/query_bench.py                     # defaults below (about 3 minutes)
    .venv/bin/python benchmarks/query_bench.py --rounds 1 --seconds 5 --no-profile   # quicker

Targets (from the issue; printed, not asserted):

* throughput of A (the platform's key read) >= 0.8 x that of B (a bare FastAPI endpoint doing one
  Redis read), both measured side by side in the same server setup;
* p99 latency of A at half of its saturation rate <= 3 ms (issue 10; it was 5 ms).

Setup. A fresh data dir (a temp dir unless ``--data-dir``) gets an embedded Redis
(``deploy.runtime.redis_server.ensure_embedded_redis``: AOF, Unix socket) and a wordcount master dataset
of ``--lines`` lines of random words drawn from a ``--vocab``-word vocabulary
(``MasterDataset.append(pipeline.schema.validate(...))``), and one batch generation is published
with ``run_batch`` (one SparkSession, in a child process so that the JVM is gone before anything
is measured).

Two servers run side by side, each its own process, uvicorn with one worker, loopback, the same
settings (reads need no API key on loopback) and the same Redis URL:

  A. the platform: ``python -m deploy.cli serve`` (LAMBDA_DATA_DIR, LAMBDA_REDIS_URL,
     LAMBDA_HTTP_PORT, LAMBDA_PIPELINE=wordcount), queried at ``/v1/views/word_counts/keys/{word}``:
     routing, auth dependency, metrics middleware, one atomic Lua read (generation pointer, batch
     and realtime parts, metadata), monoid merge, response model;
  B. ``bare_app()`` in this module, run by ``uvicorn.run`` with the same arguments as
     ``deploy.cli serve``: ``GET /bare/{word}`` does one ``redis.asyncio`` HGET of the word's row
     in the served generation (the same Redis, a client built with the same options) and
     returns ``{"key", "count"}`` as JSON.

Before measuring, both answers are checked against the counts of the generated lines.

Load. Each measurement runs a fresh load-generator process (this file with ``--loadgen``): a lean
HTTP/1.1 client written on raw asyncio protocols (uvloop) over keep-alive connections, one
request in flight per connection, requests pre-built, keys = the existing words round-robin. It
connects first, then starts on a signal so the CPU figures cover the load only.

1. Saturation, closed loop: ``--connections`` connections each send the next request as soon as
   the answer arrives, for ``--seconds`` s; A and B alternate (A B A B ...) for ``--rounds``
   rounds after an untimed warm-up of each, to cancel drift. Printed per run: requests/s,
   client-side latency, CPU per request of the server, of Redis and of the client, and the cores
   other processes used. Then the median requests/s of A and B and their ratio A/B (target >= 0.8),
   and the same ratio by server CPU per request (steadier on a busy machine).
2. Half of saturation, open loop: A at half its median saturation rate, requests sent on a fixed
   schedule (rate fixed in advance, not waiting for answers) over ``--open-connections``
   connections, for ``--seconds`` s. Latency is measured from the *intended* send time (so a stall
   is not hidden by the client waiting: no coordinated omission) and also from the actual send;
   the client's own lateness (its timers tick in 1 ms steps) is printed too. Target: p99 <= 3 ms.
   B is run at the same rate, and A's p99 is printed as a multiple of B's (the absolute 3 ms is
   below what the bare endpoint itself reaches on a busy 2-core host).
3. Where A's time goes (``--profile``, default: when A/B < 0.8; ``--no-profile`` skips). First
   over HTTP, a third server (this file with ``--serve-what-if``: A's settings and app, changed in
   memory only) is measured like 1, one run each: A' = A's route with its sync dependencies made
   async, A'' = A's answer on a plain Starlette route of the same app; then B once more. Then in
   this process, with no HTTP server, one request path at a time is awaited sequentially and timed
   (wall and CPU per request): the bare HGET, ``ServingStore.read`` (the Lua read),
   ``queries.key_answer`` (read + merge + answer model), then both complete ASGI apps, then two
   what-ifs built in memory only (no product file changes): A's app with its sync dependencies
   (``serving.api.deps.get_store`` / ``get_pipeline``, which FastAPI runs in the thread pool) swapped
   for async ones, and A's answer served by a plain Starlette ``Route`` in the same app. The
   platform's ASGI path is then run under cProfile; own time is summed per package and the top
   functions are listed (for coroutines, ncalls counts resumptions).

The load generator shares the machine's cores with the servers and Redis (2 cores on the
reference machine): each requests/s figure is what one server process reaches while the client
also runs. The CPU-per-request figures do not depend on that. Before each run the benchmark waits
(up to ``--quiet-timeout`` s) until other processes use fewer than ``--quiet-cores`` cores.
Servers, the embedded Redis and the temp dir are cleaned up at the end.
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
from pathlib import Path
from typing import Any

from _harness import HOST, ROOT, embedded_redis, free_port, git_commit, stop, wait_up, write_figures
from _query_apps import serve_bare, serve_what_if
from _query_data import PIPELINE, VIEW, setup
from _query_loadgen import run_loadgen
from _query_measure import Machine, Run, measure, ms
from _query_profile import breakdown

SCRIPT = str(Path(__file__).resolve())


def _commit() -> str:
    head, changed = git_commit("serving", "deploy", "shared_logic")
    return head + (f" + uncommitted {', '.join(changed)}" if changed else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, default=2000, help="wordcount lines in the master dataset (default 2000)")
    parser.add_argument("--vocab", type=int, default=500, help="distinct words the lines draw from (default 500)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--rounds", type=int, default=3, help="A B rounds at saturation (default 3)")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each measured run (default 10)")
    parser.add_argument("--warmup", type=float, default=3.0, help="untimed closed-loop seconds per server first")
    parser.add_argument("--connections", type=int, default=32, help="closed-loop connections at saturation (default 32)")
    parser.add_argument("--open-connections", type=int, default=32, help="connections of the open-loop run (default 32)")
    parser.add_argument("--half", type=float, default=0.5, help="open-loop rate as a share of A's saturation rate")
    parser.add_argument("--profile", dest="profile", action="store_true", default=None,
                        help="always print where A's time goes (default: only when A/B < 0.8)")
    parser.add_argument("--no-profile", dest="profile", action="store_false", help="never profile")
    parser.add_argument("--profile-requests", type=int, default=3000, help="requests per in-process timing (default 3000)")
    parser.add_argument("--quiet-cores", type=float, default=0.3, help="wait until other processes use fewer cores")
    parser.add_argument("--quiet-timeout", type=float, default=30.0)
    parser.add_argument("--data-dir", type=Path, default=None, help="keep the data here (default: a temp dir, removed)")
    parser.add_argument("--json", type=Path, default=None, help="write the figures to this JSON file (for suite.py)")
    # internal modes: this file is also the bare server, the setup step and the load generator
    parser.add_argument("--serve-bare", nargs=2, metavar=("PORT", "REDIS_URL"), help=argparse.SUPPRESS)
    parser.add_argument("--serve-what-if", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--setup", nargs=2, metavar=("DATA_DIR", "REDIS_URL"), help=argparse.SUPPRESS)
    parser.add_argument("--loadgen", metavar="SPEC", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.serve_bare:
        serve_bare(int(args.serve_bare[0]), args.serve_bare[1])
        return
    if args.serve_what_if:
        serve_what_if()
        return
    if args.loadgen:
        run_loadgen(args.loadgen)
        return
    if args.setup:
        data_dir = Path(args.setup[0])
        setup(data_dir, args.setup[1], args.lines, args.vocab, args.seed, data_dir / "setup.json")
        sys.stdout.flush()
        os._exit(0)  # pyarrow/delta-rs may abort at interpreter shutdown (see deploy.cli.main)
    bench(args)


class _Bench:
    """One benchmark run: the data dir, Redis, the servers (A, B, later the what-if server) and their logs."""

    def __init__(self, args: argparse.Namespace, data_dir: Path, redis_url: str) -> None:
        from deploy.settings import load_settings

        self.args, self.data_dir, self.redis_url = args, data_dir, redis_url
        self.settings = load_settings(data_dir=data_dir, pipeline=PIPELINE, redis_url=redis_url)
        self.servers: dict[str, subprocess.Popen[bytes]] = {}
        self.logs: list[Any] = []
        self.ports: dict[str, int] = {}
        self.paths: dict[str, list[str]] = {}
        self.env_a: dict[str, str] = {}
        #: the headline figures, written by ``--json``
        self.figures: dict[str, float] = {}

    def start(self, name: str, argv: list[str], env: dict[str, str], log_name: str) -> Path:
        log_path = self.data_dir / log_name
        log = log_path.open("wb")
        self.logs.append(log)
        self.servers[name] = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        return log_path

    def close(self) -> None:
        for proc in self.servers.values():
            stop(proc)
        for log in self.logs:
            log.close()

    def spec(self, target: str, mode: str, connections: int, seconds: float, rate: float | None = None) -> dict[str, Any]:
        return {"port": self.ports[target], "paths": self.paths[target], "mode": mode, "connections": connections,
                "seconds": seconds, "rate": rate}


def bench(args: argparse.Namespace) -> None:
    from deploy.settings import load_settings

    tmp = None if args.data_dir else tempfile.TemporaryDirectory(prefix="query-bench-")
    data_dir = (args.data_dir or Path(tmp.name)).resolve()  # type: ignore[union-attr]
    data_dir.mkdir(parents=True, exist_ok=True)
    settings = load_settings(data_dir=data_dir, pipeline=PIPELINE)
    run: _Bench | None = None
    try:
        with embedded_redis(settings.redis_dir) as redis_url:
            print(f"query benchmark: pipeline {PIPELINE}, view {VIEW}; {os.cpu_count()} cores; commit {_commit()}")
            print(f"  data {data_dir}; embedded Redis {redis_url}")
            run = _Bench(args, data_dir, redis_url)
            try:
                counts = _setup(run)
                keys = sorted(counts)
                _start_servers(run, keys)
                _check(run, counts, keys)
                machine = Machine(int((run.settings.redis_dir / "redis.pid").read_text()))
                ratio, median_a = _saturation(run, machine)
                _half(run, machine, median_a)
                if args.json:
                    write_figures(args.json, "query", run.figures)
                if args.profile or (args.profile is None and ratio < 0.8):
                    _where_time_goes(run, machine, counts, keys, ratio)
            finally:
                run.close()
    finally:
        if tmp is not None:
            tmp.cleanup()


def _setup(run: _Bench) -> dict[str, int]:
    """Master dataset + one generation, Spark in a child process; returns the expected count per word."""
    args, data_dir = run.args, run.data_dir
    t0 = time.perf_counter()
    setup_log = data_dir / "setup.log"
    with setup_log.open("wb") as log:
        rc = subprocess.run([sys.executable, SCRIPT, "--setup", str(data_dir), run.redis_url, "--lines", str(args.lines),
                             "--vocab", str(args.vocab), "--seed", str(args.seed)], cwd=ROOT, stdout=log,
                            stderr=subprocess.STDOUT).returncode
    if rc != 0 or not (data_dir / "setup.json").exists():
        raise SystemExit(f"setup failed ({rc}): {setup_log.read_text()[-3000:]}")
    setup = json.loads((data_dir / "setup.json").read_text())
    counts: dict[str, int] = setup["counts"]
    print(f"  setup: {args.lines:,} lines, {setup['events']:,} events, {sum(counts.values()):,} words, "
          f"{len(counts)} distinct; generation {setup['generation']} published "
          f"(rows {setup['rows']}; run_batch {setup['seconds']:.1f} s incl. Spark start; "
          f"{time.perf_counter() - t0:.0f} s in all)")
    return counts


def _start_servers(run: _Bench, keys: list[str]) -> None:
    run.ports = {"A platform": free_port(), "B bare": free_port()}
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("LAMBDA_")}
    run.env_a = {**base_env, "LAMBDA_DATA_DIR": str(run.data_dir), "LAMBDA_REDIS_URL": run.redis_url,
                 "LAMBDA_HTTP_HOST": HOST, "LAMBDA_HTTP_PORT": str(run.ports["A platform"]),
                 "LAMBDA_PIPELINE": PIPELINE, "LAMBDA_ENV_FILE": str(run.data_dir / "no.env")}
    log_a = run.start("A platform", [sys.executable, "-m", "deploy.cli", "serve"], run.env_a, "server-A.log")
    log_b = run.start("B bare", [sys.executable, SCRIPT, "--serve-bare", str(run.ports["B bare"]), run.redis_url],
                      run.env_a, "server-B.log")
    wait_up(f"http://{HOST}:{run.ports['A platform']}/readyz", run.servers["A platform"], log_a)
    wait_up(f"http://{HOST}:{run.ports['B bare']}/healthz", run.servers["B bare"], log_b)
    run.paths = {"A platform": [f"/v1/views/{VIEW}/keys/{k}" for k in keys], "B bare": [f"/bare/{k}" for k in keys]}


def _check(run: _Bench, counts: dict[str, int], keys: list[str]) -> None:
    """Both servers answer every key with the expected count."""
    import httpx

    wrong = 0
    port_a, port_b = run.ports["A platform"], run.ports["B bare"]
    with httpx.Client(timeout=5) as http:
        for k in keys:
            a = http.get(f"http://{HOST}:{port_a}/v1/views/{VIEW}/keys/{k}")
            b = http.get(f"http://{HOST}:{port_b}/bare/{k}")
            if a.status_code != 200 or b.status_code != 200 or \
                    a.json()["value"]["count"] != counts[k] or b.json()["count"] != counts[k]:
                wrong += 1
                if wrong <= 3:
                    print(f"  ! {k}: expected {counts[k]}, A {a.status_code} {a.text[:150]}, B {b.status_code} {b.text[:150]}")
        sample = http.get(f"http://{HOST}:{port_a}{run.paths['A platform'][0]}").text
    print(f"  check: {len(keys) - wrong}/{len(keys)} keys answered with the expected count by both A and B")
    print(f"  A answers e.g. {sample}")
    print("  servers: A `python -m deploy.cli serve`, B `bare_app()` under uvicorn.run with deploy.cli's arguments; "
          "each 1 uvicorn worker on 127.0.0.1, both reading the same Redis over its Unix socket")
    print("  client: one load-generator process per run, raw asyncio protocols on uvloop, keep-alive HTTP/1.1, "
          "keys round-robin; it SHARES the machine's cores with both servers and Redis "
          f"({os.cpu_count()} cores here), so req/s are with the client's CPU taken out of the same budget")


def _saturation(run: _Bench, machine: Machine) -> tuple[float, float]:
    """1. Closed loop, A B alternating; returns (A/B by req/s, A's median req/s)."""
    args = run.args
    pids = [p.pid for p in run.servers.values()]
    print(f"\n1. saturation: closed loop, {args.connections} connections, {args.seconds:g} s per run, "
          f"{args.rounds} rounds A B (after {args.warmup:g} s untimed warm-up of each)")
    targets = list(run.ports)
    for target in targets:
        measure(machine, run.servers[target].pid, target, run.spec(target, "closed", args.connections, args.warmup))
    runs: dict[str, list[Run]] = {t: [] for t in targets}
    for rnd in range(1, args.rounds + 1):
        for target in targets:
            machine.wait_quiet(pids, args.quiet_cores, args.quiet_timeout)
            result = measure(machine, run.servers[target].pid, target,
                             run.spec(target, "closed", args.connections, args.seconds))
            runs[target].append(result)
            print(f"  round {rnd}: {result.line()}", flush=True)
    med = {t: statistics.median(r.rps for r in rs) for t, rs in runs.items()}
    cpu = {t: statistics.median(r.per_req_us(r.server_cpu) for r in rs) for t, rs in runs.items()}
    ratio = med["A platform"] / med["B bare"]
    run.figures.update({"a_rps": med["A platform"], "b_rps": med["B bare"], "a_over_b": ratio,
                        "a_cpu_us": cpu["A platform"], "b_cpu_us": cpu["B bare"], "rounds": args.rounds,
                        "others_cores": statistics.median(r.others_cores for rs in runs.values() for r in rs)})
    print(f"  median: A {med['A platform']:,.0f} req/s, B {med['B bare']:,.0f} req/s")
    print(f"  THROUGHPUT A/B = {ratio:.2f}   (target >= 0.80: {'met' if ratio >= 0.8 else 'NOT met'})")
    print(f"  server CPU per request: A {cpu['A platform']:.0f} us, B {cpu['B bare']:.0f} us; "
          f"B/A = {cpu['B bare'] / cpu['A platform']:.2f} (the throughput ratio a CPU-bound server would reach "
          "if each had a core to itself)")
    return ratio, med["A platform"]


def _half(run: _Bench, machine: Machine, median_a: float) -> None:
    """2. Open loop at half of A's saturation rate, A then B at the same rate."""
    args = run.args
    pids = [p.pid for p in run.servers.values()]
    rate = args.half * median_a
    print(f"\n2. half of saturation: open loop at {rate:,.0f} req/s ({args.half:g} x A's median), "
          f"{args.open_connections} connections, {args.seconds:g} s; latency from the intended send time "
          "(and from the actual send)")
    half: dict[str, Run] = {}
    for target in ["A platform", "B bare"]:
        machine.wait_quiet(pids, args.quiet_cores, args.quiet_timeout)
        result = measure(machine, run.servers[target].pid, target,
                         run.spec(target, "open", args.open_connections, args.seconds, rate))
        half[target] = result
        r = result.result
        print(f"  {result.line()}")
        print(f"      from intended send: {ms(r['latency'], 'p50', 'p95', 'p99', 'p999', 'max')}")
        print(f"      from actual send:   {ms(r['service'], 'p50', 'p95', 'p99', 'p999', 'max')}")
        print(f"      client lateness:    {ms(r['lag'], 'p50', 'p99', 'max')}")
    p99 = half["A platform"].result["latency"]["p99"] * 1e3
    bare = half["B bare"].result["latency"]["p99"] * 1e3
    run.figures.update({"half_rate": rate, "a_p99_ms": p99, "b_p99_ms": bare, "p99_a_over_b": p99 / bare,
                        "a_half_failures": half["A platform"].result["failures"]})
    print(f"  A p99 AT HALF SATURATION = {p99:.2f} ms   (target <= 3 ms: {'met' if p99 <= 3 else 'NOT met'}); "
          f"B at the same rate: p99 {bare:.2f} ms")
    print(f"  p99 A/B AT THE SAME RATE = {p99 / bare:.2f}   (the platform's p99 as a multiple of the bare endpoint's, "
          "both at A's half-saturation rate)")


def _where_time_goes(run: _Bench, machine: Machine, counts: dict[str, int], keys: list[str], ratio: float) -> None:
    """3. The what-if server over HTTP (A', A''), then B again; then the in-process breakdown."""
    import httpx

    args = run.args
    pids = [p.pid for p in run.servers.values()]
    port = free_port()
    log_path = run.start("A what-if", [sys.executable, SCRIPT, "--serve-what-if"],
                         {**run.env_a, "LAMBDA_HTTP_PORT": str(port)}, "server-what-if.log")
    wait_up(f"http://{HOST}:{port}/readyz", run.servers["A what-if"], log_path)
    whatifs = {"A' async deps": f"/v1/views/{VIEW}/keys/", "A'' Starlette": f"/fast/{VIEW}/keys/"}
    for target, prefix in whatifs.items():
        run.ports[target] = port
        run.paths[target] = [prefix + k for k in keys]
        with httpx.Client(timeout=5) as http:
            answer = http.get(f"http://{HOST}:{port}{run.paths[target][0]}")
            if answer.status_code != 200 or answer.json()["value"]["count"] != counts[keys[0]]:
                raise SystemExit(f"the what-if server answers wrong: {answer.status_code} {answer.text[:300]}")
    print("\n3. where A's time goes. What-ifs over HTTP: A's server with its app changed in memory only "
          "(product files untouched), `--serve-what-if`: A' = A's route with serving.api.deps.get_store/"
          "get_pipeline made async (FastAPI runs sync dependencies in its thread pool); A'' = A's answer "
          "(queries.key_answer + KeyAnswer JSON) on a plain Starlette Route in the same app (metrics "
          "middleware kept; no FastAPI params/deps/auth). Closed loop as in 1, one run each, then B again.")
    what_if_pid = run.servers["A what-if"].pid
    for target in whatifs:
        measure(machine, what_if_pid, target, run.spec(target, "closed", args.connections, args.warmup))
    what: dict[str, Run] = {}
    for target in [*whatifs, "B bare"]:
        machine.wait_quiet([*pids, what_if_pid], args.quiet_cores, args.quiet_timeout)
        pid = run.servers["B bare" if target == "B bare" else "A what-if"].pid
        what[target] = measure(machine, pid, target, run.spec(target, "closed", args.connections, args.seconds))
        print(f"  {what[target].line()}", flush=True)
    b = what["B bare"]
    for target in whatifs:
        print(f"  {target}/B = {what[target].rps / b.rps:.2f} by req/s, "
              f"{b.per_req_us(b.server_cpu) / what[target].per_req_us(what[target].server_cpu):.2f}"
              f" by server CPU/req  (A as is: {ratio:.2f})")
    for target in list(run.servers):
        stop(run.servers.pop(target))  # the in-process timing gets the cores to itself
    timing = breakdown(run.settings, run.redis_url, keys, args.profile_requests, args.profile_requests)
    try:
        import uvloop  # the servers' loop

        uvloop.run(timing)
    except ImportError:
        asyncio.run(timing)


if __name__ == "__main__":
    main()
