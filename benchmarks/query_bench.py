"""Query benchmark: GET /v1/views/{view}/keys/{key} against a bare FastAPI endpoint doing one Redis read.

    .venv/bin/python benchmarks/query_bench.py                     # defaults below (about 3 minutes)
    .venv/bin/python benchmarks/query_bench.py --rounds 1 --seconds 5 --no-profile   # quicker

Targets (from the issue; printed, not asserted):

* throughput of A (the platform's key read) >= 0.8 x that of B (a bare FastAPI endpoint doing one
  Redis read), both measured side by side in the same server setup;
* p99 latency of A at half of its saturation rate <= 5 ms.

Setup. A fresh data dir (a temp dir unless ``--data-dir``) gets an embedded Redis
(``deploy.redis_server.ensure_embedded_redis``: AOF, Unix socket) and a wordcount master dataset
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
   the client's own lateness (its timers tick in 1 ms steps) is printed too. Target: p99 <= 5 ms.
   B is run at the same rate for reference.
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
import collections
import json
import os
import random
import statistics
import string
import subprocess
import sys
import tempfile
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PIPELINE = "wordcount"
VIEW = "word_counts"
HOST = "127.0.0.1"


# --------------------------------------------------------------------------- B: the bare app


def bare_app(redis_url: str | None = None, pipeline: str = PIPELINE, view: str = VIEW):
    """A bare FastAPI app: ``GET /bare/{key}`` = one HGET of the key's row in the served generation.

    The generation pointer is read once at startup (the bare endpoint does one Redis read per
    request). The Redis client has the options ``serving.api.view_reader.ServingStore`` uses.
    """
    from fastapi import FastAPI, HTTPException

    from serving.store.connection import async_redis_client
    from serving.store.keys import Keys

    url = redis_url or os.environ["BENCH_REDIS_URL"]
    state: dict[str, Any] = {}

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        client, keys = async_redis_client(url), Keys(pipeline)
        generation = await client.get(keys.current)
        if generation is None:
            raise RuntimeError("no generation is published")
        layout = await client.hget(keys.meta(int(generation)), f"measures:{view}")
        state["client"], state["rows"] = client, keys.rows(int(generation), view)
        state["count"] = json.loads(layout).index("count")
        try:
            yield
        finally:
            await client.aclose()

    app = FastAPI(title="bare", lifespan=lifespan)

    @app.get("/bare/{key}")
    async def bare(key: str) -> dict[str, Any]:
        row = await state["client"].hget(state["rows"], key)
        if row is None:
            raise HTTPException(404, f"key {key!r} not found")
        return {"key": key, "count": int(json.loads(row)[state["count"]])}

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app


def _serve_bare(port: int, redis_url: str) -> None:
    import uvicorn

    # the same call as deploy.cli's _serve
    uvicorn.run(bare_app(redis_url), host=HOST, port=port, log_level="info", access_log=False)


def _serve_what_if() -> None:
    """A's server as ``deploy.cli serve`` runs it (settings from the environment), with ``_what_if``
    applied to the app in memory: async dependencies, and A's answer on a plain Starlette route."""
    import uvicorn

    from deploy.settings import load_settings
    from serving.api.app import create_app

    settings = load_settings()
    app = create_app(settings, redis_url=settings.redis_url)  # type: ignore[arg-type]
    _what_if(app)
    uvicorn.run(app, host=settings.http_host, port=settings.http_port, log_level="info", access_log=False)


# --------------------------------------------------------------------------- setup (child process)


def make_events(lines: int, vocab: int, seed: int) -> tuple[list[dict[str, str]], collections.Counter[str]]:
    rng = random.Random(seed)
    words: set[str] = set()
    while len(words) < vocab:
        words.add("".join(rng.choices(string.ascii_lowercase, k=rng.randint(3, 9))))
    vocabulary = sorted(words)
    events, counts = [], collections.Counter()
    for i in range(lines):
        line = [rng.choice(vocabulary) for _ in range(rng.randint(4, 12))]
        counts.update(line)
        events.append({"text": " ".join(line),
                       "event_time": f"2026-01-01T{i // 3600 % 24:02d}:{i // 60 % 60:02d}:{i % 60:02d}Z"})
    return events, counts


def _setup(data_dir: Path, redis_url: str, lines: int, vocab: int, seed: int, out: Path) -> None:
    """Master dataset + one published generation; writes the expected counts to ``out``."""
    from batch_layer.master.dataset import MasterDataset
    from batch_layer.recompute.job import run_batch
    from deploy.settings import load_settings
    from deploy.spark import build_spark
    from shared_logic.registry import load_pipeline

    settings = load_settings(data_dir=data_dir, pipeline=PIPELINE, redis_url=redis_url)
    pipeline = load_pipeline(PIPELINE)
    events, counts = make_events(lines, vocab, seed)
    master = MasterDataset.open(settings, pipeline)
    version = master.append(pipeline.schema.validate(events))
    started = time.perf_counter()
    spark = build_spark(settings, "query-bench-setup")
    try:
        result = run_batch(spark, settings, pipeline, redis_url=redis_url)
    finally:
        spark.stop()
    out.write_text(json.dumps({"version": version, "generation": result.generation, "events": result.events,
                               "rows": result.view_rows, "seconds": time.perf_counter() - started,
                               "counts": dict(counts)}))


# --------------------------------------------------------------------------- load generator (child process)


class _Conn(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection with one request in flight; parses Content-Length bodies."""

    def __init__(self, gen: _Gen) -> None:
        self.gen, self.buf, self.need, self.status = gen, bytearray(), -1, b""
        self.transport: asyncio.Transport | None = None
        self.sched = self.sent = 0.0
        self.busy = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.gen.lost(self)

    def send(self, sched: float) -> None:
        self.busy = True
        self.sched = sched
        self.sent = time.perf_counter()
        self.transport.write(self.gen.next_request())  # type: ignore[union-attr]

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        while True:
            if self.need < 0:
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    return
                head = bytes(buf[:end])
                self.status = head[9:12]
                at = head.lower().find(b"content-length:")
                if at >= 0:
                    eol = head.find(b"\r\n", at)
                    self.need = int(head[at + 15:eol if eol > 0 else len(head)])
                else:
                    self.need = 0
                del buf[:end + 4]
            if len(buf) < self.need:
                return
            del buf[:self.need]
            self.need = -1
            self.busy = False
            self.gen.done(self, self.status)


class _Gen:
    def __init__(self, requests: list[bytes]) -> None:
        self.requests, self.i = requests, 0
        self.latencies: list[float] = []  # from intended send time
        self.service: list[float] = []  # from actual send
        self.lags: list[float] = []  # actual - intended send time
        self.failures, self.lost_connections, self.completed = 0, 0, 0
        self.statuses: collections.Counter[bytes] = collections.Counter()
        self.finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def next_request(self) -> bytes:
        request = self.requests[self.i % len(self.requests)]
        self.i += 1
        return request

    def record(self, conn: _Conn, status: bytes) -> float:
        now = time.perf_counter()
        self.latencies.append(now - conn.sched)
        self.service.append(now - conn.sent)
        self.lags.append(conn.sent - conn.sched)
        self.completed += 1
        if status != b"200":
            self.failures += 1
            self.statuses[status] += 1
        return now

    def lost(self, conn: _Conn) -> None:
        if conn.busy:
            self.lost_connections += 1
            conn.busy = False
            self.gone(conn)

    def gone(self, conn: _Conn) -> None:  # pragma: no cover - overridden
        pass

    def done(self, conn: _Conn, status: bytes) -> None:  # pragma: no cover - overridden
        raise NotImplementedError


class _Closed(_Gen):
    """Closed loop: each connection sends its next request when the answer to the last arrived."""

    def start(self, conns: list[_Conn], seconds: float) -> None:
        self.active = len(conns)
        self.started = time.perf_counter()
        self.deadline = self.started + seconds
        for c in conns:
            c.send(time.perf_counter())

    def done(self, conn: _Conn, status: bytes) -> None:
        now = self.record(conn, status)
        if now < self.deadline:
            conn.send(now)
        else:
            self.gone(conn)

    def gone(self, conn: _Conn) -> None:
        self.active -= 1
        if self.active == 0 and not self.finished.done():
            self.finished.set_result(None)


class _Open(_Gen):
    """Open loop: request k is due at start + k / rate, whatever the answers do."""

    def start(self, conns: list[_Conn], seconds: float, rate: float) -> None:
        self.loop = asyncio.get_running_loop()
        self.idle = collections.deque(conns)
        self.backlog: collections.deque[float] = collections.deque()
        self.rate, self.total, self.k = rate, int(rate * seconds), 0
        self.started = time.perf_counter()
        self.tick()

    def tick(self) -> None:
        now = time.perf_counter()
        while self.k < self.total:
            due = self.started + self.k / self.rate
            if due > now:
                break
            self.k += 1
            if self.idle:
                self.idle.popleft().send(due)  # FIFO: every connection stays warm (no keep-alive timeout)
            else:
                self.backlog.append(due)
        if self.k < self.total:
            # libuv timers tick in whole milliseconds: wait at least 1 ms rather than spin
            self.loop.call_later(max(0.001, self.started + self.k / self.rate - now), self.tick)

    def done(self, conn: _Conn, status: bytes) -> None:
        self.record(conn, status)
        self.gone(conn, answered=True)

    def gone(self, conn: _Conn, answered: bool = False) -> None:
        if not answered:
            self.completed += 1  # lost in flight: counts as done (and as a failure)
            self.failures += 1
        elif self.backlog:
            conn.send(self.backlog.popleft())
        else:
            self.idle.append(conn)
        if self.completed >= self.total and not self.finished.done():
            self.finished.set_result(None)


def _summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values) or [float("nan")]
    n = len(ordered)
    return {"p50": ordered[n // 2], "p90": ordered[min(n - 1, int(0.90 * n))], "p95": ordered[min(n - 1, int(0.95 * n))],
            "p99": ordered[min(n - 1, int(0.99 * n))], "p999": ordered[min(n - 1, int(0.999 * n))], "max": ordered[-1]}


async def _loadgen(spec: dict[str, Any]) -> dict[str, Any]:
    port, paths = spec["port"], spec["paths"]
    requests = [f"GET {p} HTTP/1.1\r\nHost: {HOST}:{port}\r\n\r\n".encode() for p in paths]
    loop = asyncio.get_running_loop()
    gen: _Gen = _Open(requests) if spec["mode"] == "open" else _Closed(requests)
    conns = []
    for _ in range(spec["connections"]):
        _, conn = await loop.create_connection(lambda: _Conn(gen), HOST, port)
        conns.append(conn)
    print("ready", flush=True)
    await loop.run_in_executor(None, sys.stdin.readline)  # "go"
    cpu0 = time.process_time()
    if isinstance(gen, _Open):
        gen.start(conns, spec["seconds"], spec["rate"])
    else:
        gen.start(conns, spec["seconds"])
    await gen.finished
    elapsed = time.perf_counter() - gen.started
    cpu = time.process_time() - cpu0
    for c in conns:
        if c.transport is not None:
            c.transport.close()
    return {"requests": gen.completed, "seconds": elapsed, "failures": gen.failures,
            "statuses": {k.decode(errors="replace"): v for k, v in gen.statuses.items()},
            "lost": gen.lost_connections, "client_cpu": cpu, "latency": _summary(gen.latencies),
            "service": _summary(gen.service), "lag": _summary(gen.lags), "loop": type(loop).__module__}


def _run_loadgen(spec_json: str) -> None:
    spec = json.loads(spec_json)
    try:
        import uvloop

        result = uvloop.run(_loadgen(spec))
    except ImportError:
        result = asyncio.run(_loadgen(spec))
    print(json.dumps(result), flush=True)


# --------------------------------------------------------------------------- orchestration


@dataclass
class Run:
    target: str
    mode: str
    connections: int
    result: dict[str, Any]
    server_cpu: float
    redis_cpu: float
    others_cores: float
    rate: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def rps(self) -> float:
        return self.result["requests"] / self.result["seconds"]

    def per_req_us(self, cpu: float) -> float:
        return cpu / max(1, self.result["requests"]) * 1e6

    def line(self) -> str:
        r, lat = self.result, self.result["latency"] if self.mode == "open" else self.result["service"]
        fail = f"  FAILURES {r['failures']} {r['statuses']} lost {r['lost']}" if r["failures"] or r["lost"] else ""
        return (f"{self.target:<14} {self.mode:<6} x{self.connections:<3d} {r['seconds']:5.1f} s {self.rps:7,.0f} req/s"
                f"  p50 {lat['p50'] * 1e3:5.2f} p99 {lat['p99'] * 1e3:6.2f} ms"
                f"  CPU/req: server {self.per_req_us(self.server_cpu):4.0f} us, redis {self.per_req_us(self.redis_cpu):3.0f} us,"
                f" client {self.per_req_us(r['client_cpu']):4.0f} us  others {self.others_cores:.2f} cores{fail}")


class Machine:
    """CPU of the server processes, Redis, and everything else."""

    def __init__(self, redis_pid: int) -> None:
        import psutil

        self.psutil = psutil
        self.redis = psutil.Process(redis_pid)
        self.me = psutil.Process()

    @staticmethod
    def _cpu(p: Any) -> float:
        t = p.cpu_times()
        return t.user + t.system

    def busy(self) -> float:
        t = self.psutil.cpu_times()
        return t.user + t.system + getattr(t, "nice", 0.0) + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0)

    def wait_quiet(self, exclude: list[int], cores: float, timeout: float) -> None:
        procs = [self.psutil.Process(pid) for pid in exclude] + [self.redis, self.me]
        deadline = time.monotonic() + timeout
        while True:
            t0, b0, p0 = time.perf_counter(), self.busy(), sum(self._cpu(p) for p in procs)
            time.sleep(1.0)
            used = (self.busy() - b0 - (sum(self._cpu(p) for p in procs) - p0)) / (time.perf_counter() - t0)
            if used < cores:
                return
            if time.monotonic() > deadline:
                print(f"  (other processes still use {used:.2f} cores after {timeout:g} s: measuring anyway)")
                return


def measure(machine: Machine, server_pid: int, target: str, spec: dict[str, Any]) -> Run:
    """One load-generator process against one server; CPU sampled around the load only."""
    server = machine.psutil.Process(server_pid)
    gen = subprocess.Popen([sys.executable, __file__, "--loadgen", json.dumps(spec)], cwd=ROOT,
                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        if gen.stdout.readline().strip() != "ready":  # type: ignore[union-attr]
            raise SystemExit(f"the load generator failed to connect to {target}")
        client = machine.psutil.Process(gen.pid)
        t0, busy0 = time.perf_counter(), machine.busy()
        s0, r0, c0, m0 = machine._cpu(server), machine._cpu(machine.redis), machine._cpu(client), machine._cpu(machine.me)
        gen.stdin.write("go\n")  # type: ignore[union-attr]
        gen.stdin.flush()  # type: ignore[union-attr]
        out = gen.stdout.readline()  # type: ignore[union-attr]
        t1, busy1 = time.perf_counter(), machine.busy()
        s1, r1, m1 = machine._cpu(server), machine._cpu(machine.redis), machine._cpu(machine.me)
        try:
            c1 = machine._cpu(client)
        except machine.psutil.Error:
            c1 = c0
        gen.wait(30)
    finally:
        if gen.poll() is None:
            gen.kill()
    if not out:
        raise SystemExit(f"the load generator against {target} printed nothing (exit {gen.returncode})")
    result = json.loads(out)
    others = (busy1 - busy0) - (s1 - s0) - (r1 - r0) - (c1 - c0) - (m1 - m0)
    return Run(target, spec["mode"], spec["connections"], result, s1 - s0, r1 - r0,
               max(0.0, others / (t1 - t0)), spec.get("rate"))


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _wait_up(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 90) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited ({proc.returncode}): {log.read_text()[-3000:]}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{url} did not answer 200 within {timeout}s; see {log}")


def _stop(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "serving", "deploy", "shared_logic"], cwd=ROOT,
                               capture_output=True, text=True).stdout.splitlines()
    except OSError:
        return "unknown"
    changed = [line[3:] for line in dirty if line.strip()]
    return head + (f" + uncommitted {', '.join(changed)}" if changed else "")


def _ms(summary: dict[str, float], *names: str) -> str:
    return "  ".join(f"{n} {summary[n] * 1e3:6.2f}" for n in names) + " ms"


# --------------------------------------------------------------------------- in-process breakdown


@asynccontextmanager
async def _lifespan(app: Any):
    """Drive the ASGI lifespan protocol (startup before, shutdown after)."""
    inbox: asyncio.Queue[dict[str, str]] = asyncio.Queue()
    started, stopped = asyncio.Event(), asyncio.Event()

    async def send(message: dict[str, Any]) -> None:
        if message["type"].startswith("lifespan.startup"):
            if message["type"].endswith("failed"):
                raise RuntimeError(message.get("message"))
            started.set()
        elif message["type"].startswith("lifespan.shutdown"):
            stopped.set()

    task = asyncio.create_task(app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}, inbox.get, send))
    await inbox.put({"type": "lifespan.startup"})
    await started.wait()
    try:
        yield
    finally:
        await inbox.put({"type": "lifespan.shutdown"})
        await stopped.wait()
        await task


def _asgi_caller(app: Any) -> Any:
    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def call(path: str) -> int:
        status = 0
        body = bytearray()

        async def send(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body":
                body.extend(message.get("body", b""))

        scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
                 "method": "GET", "scheme": "http", "path": path, "raw_path": path.encode(), "root_path": "",
                 "query_string": b"", "headers": [(b"host", b"127.0.0.1:8000")], "client": ("127.0.0.1", 50000),
                 "server": ("127.0.0.1", 8000), "state": {}}
        await app(scope, receive, send)
        if status != 200:
            raise RuntimeError(f"{path}: {status} {bytes(body)[:200]!r}")
        return status

    return call


async def _timed(fn: Any, keys: list[str], n: int, passes: int = 3) -> tuple[float, float]:
    """(wall, CPU) microseconds per call, the pass with the least CPU of ``passes`` (after a warm-up)."""
    for i in range(min(300, n)):
        await fn(keys[i % len(keys)])
    best = (float("inf"), float("inf"))
    for _ in range(passes):
        w0, c0 = time.perf_counter(), time.process_time()
        for i in range(n):
            await fn(keys[i % len(keys)])
        wall, cpu = (time.perf_counter() - w0) / n * 1e6, (time.process_time() - c0) / n * 1e6
        if cpu < best[1]:
            best = (wall, cpu)
    return best


def _what_if(app: Any) -> int:
    """In memory only: make A's sync dependencies (serving.api.deps.get_store / get_pipeline) async on
    ``app``'s routes, and add a plain Starlette route doing A's answer, at ``/fast/{view}/keys/{key}``."""
    from fastapi import Request
    from starlette.responses import Response
    from starlette.routing import Route

    from serving.api import deps, queries

    async def get_store(request: Request) -> Any:
        return request.app.state.store

    async def get_pipeline(request: Request) -> Any:
        return request.app.state.pipeline

    swap = {deps.get_store: get_store, deps.get_pipeline: get_pipeline}
    swapped = 0

    def walk(dependant: Any) -> None:
        nonlocal swapped
        if dependant.call in swap:
            dependant.call = swap[dependant.call]
            swapped += 1
        for sub in dependant.dependencies:
            walk(sub)

    def routes(items: list[Any]) -> None:
        for route in items:
            if getattr(route, "dependant", None) is not None:
                walk(route.dependant)
            for built in ("effective_candidates", "effective_low_priority_routes"):  # FastAPI's included routers
                if callable(getattr(route, built, None)):
                    routes(getattr(route, built)())

    routes(app.routes)

    async def fast(request: Any) -> Response:
        state, params = request.app.state, request.path_params
        view = state.pipeline.view(params["view"])
        answer = await queries.key_answer(state.store, view, params["key"])
        return Response(answer.model_dump_json(exclude_none=True), media_type="application/json")

    app.router.routes.insert(0, Route("/fast/{view}/keys/{key:path}", fast, methods=["GET"]))
    return swapped


def _package(filename: str) -> str:
    if filename.startswith("~") or filename.startswith("<"):
        return "builtins (C calls)"
    path = Path(filename)
    parts = path.parts
    if "site-packages" in parts:
        i = parts.index("site-packages")
        return parts[i + 1].split(".")[0] if i + 1 < len(parts) else "site-packages"
    try:
        rel = path.resolve().relative_to(ROOT)
        return f"project: {rel.parts[0]}" if len(rel.parts) > 1 else f"project: {rel}"
    except ValueError:
        pass
    if "python3" in filename or "lib/python" in filename:
        i = max(k for k, p in enumerate(parts) if p.startswith("python3"))
        return f"stdlib: {Path(parts[i + 1]).stem}" if i + 1 < len(parts) else "stdlib"
    return filename


async def _breakdown(settings: Any, redis_url: str, keys: list[str], n: int, profile_n: int) -> None:
    import cProfile
    import io
    import pstats

    from serving.api import queries
    from serving.api.app import create_app

    platform, bare, whatif = create_app(settings, redis_url=redis_url), bare_app(redis_url), \
        create_app(settings, redis_url=redis_url)
    swapped = _what_if(whatif)
    call_a, call_b, call_w = _asgi_caller(platform), _asgi_caller(bare), _asgi_caller(whatif)
    async with _lifespan(platform), _lifespan(bare), _lifespan(whatif):
        store = platform.state.store
        view = platform.state.pipeline.view(VIEW)
        generation = int(await store.client.get(store.keys.current))
        rows_key = store.keys.rows(generation, VIEW)
        a_path = f"/v1/views/{VIEW}/keys/"
        steps = [
            ("zscore", "B's read: redis-py HGET of the row (one round trip)", lambda k: store.client.hget(rows_key, k)),
            ("read", "A's read: ServingStore.read (EVALSHA of the Lua read)",
             lambda k: store.read(VIEW, [(k, None)], ["count"], [])),
            ("answer", "A's answer: queries.key_answer (read + merge + KeyAnswer)",
             lambda k: queries.key_answer(store, view, k)),
            ("B", "B: bare app, whole ASGI call", lambda k: call_b(f"/bare/{k}")),
            ("A", "A: platform app, whole ASGI call", lambda k: call_a(a_path + k)),
            ("A async deps", f"what-if: A with get_store/get_pipeline async ({swapped} swapped)",
             lambda k: call_w(a_path + k)),
            ("A starlette", "what-if: A's answer on a plain Starlette Route, same app",
             lambda k: call_w(f"/fast/{VIEW}/keys/{k}")),
        ]
        print(f"\n  In this process (uvloop, no HTTP server, servers stopped), {n} sequential "
              "calls per row, best of 3 passes; wall includes the Redis round trip, CPU is this process only")
        cpu: dict[str, float] = {}
        for tag, name, fn in steps:
            wall, cpu[tag] = await _timed(fn, keys, n)
            print(f"  {name:<66} {wall:7.1f} us wall  {cpu[tag]:7.1f} us CPU")
        print(f"  A - B, whole ASGI call: {cpu['A'] - cpu['B']:+.1f} us CPU per request, of which")
        print(f"    Lua read instead of HGET (client side):              {cpu['read'] - cpu['zscore']:+7.1f} us")
        print(f"    merge + KeyAnswer model:                             {cpu['answer'] - cpu['read']:+7.1f} us")
        print(f"    FastAPI layer beyond B's (deps, params, auth, response model, metrics middleware): "
              f"{(cpu['A'] - cpu['answer']) - (cpu['B'] - cpu['zscore']):+7.1f} us")
        print(f"      of which sync dependencies run in the thread pool (what-if async): {cpu['A'] - cpu['A async deps']:+7.1f} us")
        print(f"  in-process CPU ratio B/A: as is {cpu['B'] / cpu['A']:.2f}; with async deps {cpu['B'] / cpu['A async deps']:.2f}; "
              f"on a plain Starlette route {cpu['B'] / cpu['A starlette']:.2f} (uvicorn's own per-request cost, the same "
              "for both, is not in these)")

        profiler = cProfile.Profile()
        for i in range(300):
            await call_a(f"/v1/views/{VIEW}/keys/{keys[i % len(keys)]}")
        profiler.enable()
        for i in range(profile_n):
            await call_a(f"/v1/views/{VIEW}/keys/{keys[i % len(keys)]}")
        profiler.disable()
    stats = pstats.Stats(profiler)
    total = sum(v[2] for v in stats.stats.values())  # type: ignore[attr-defined]
    by_package: collections.Counter[str] = collections.Counter()
    for (filename, _, _), (_, _, tt, _, _) in stats.stats.items():  # type: ignore[attr-defined]
        by_package[_package(filename)] += tt
    print(f"\n  cProfile of A's ASGI path as is ({profile_n} requests; cProfile inflates Python-heavy code: read shares, "
          f"not absolute times; ncalls of a coroutine counts its resumptions): own time by package, "
          f"{total / profile_n * 1e6:.0f} us/req profiled in all")
    for package, tt in by_package.most_common(14):
        print(f"  {package:<40} {tt / total * 100:5.1f} %  {tt / profile_n * 1e6:6.1f} us/req")
    buf = io.StringIO()
    pstats.Stats(profiler, stream=buf).sort_stats("tottime").print_stats(22)
    lines = buf.getvalue().splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip().startswith("ncalls")), 0)
    print("\n  top functions by own time:")
    for line in lines[start:]:
        if line.strip():
            print("  " + line.replace(str(ROOT) + "/", "").replace(sys.prefix, "<venv>")[:200])
    buf = io.StringIO()
    pstats.Stats(profiler, stream=buf).sort_stats("cumulative").print_stats(r"(serving|fastapi|starlette|pydantic|redis)", 30)
    lines = buf.getvalue().splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip().startswith("ncalls")), 0)
    print("\n  top functions by cumulative time (serving, fastapi, starlette, pydantic, redis):")
    for line in lines[start:]:
        if line.strip():
            print("  " + line.replace(str(ROOT) + "/", "").replace(sys.prefix, "<venv>")[:200])


# --------------------------------------------------------------------------- main


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
    # internal modes: this file is also the bare server, the setup step and the load generator
    parser.add_argument("--serve-bare", nargs=2, metavar=("PORT", "REDIS_URL"), help=argparse.SUPPRESS)
    parser.add_argument("--serve-what-if", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--setup", nargs=2, metavar=("DATA_DIR", "REDIS_URL"), help=argparse.SUPPRESS)
    parser.add_argument("--loadgen", metavar="SPEC", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.serve_bare:
        _serve_bare(int(args.serve_bare[0]), args.serve_bare[1])
        return
    if args.serve_what_if:
        _serve_what_if()
        return
    if args.loadgen:
        _run_loadgen(args.loadgen)
        return
    if args.setup:
        data_dir = Path(args.setup[0])
        _setup(data_dir, args.setup[1], args.lines, args.vocab, args.seed, data_dir / "setup.json")
        sys.stdout.flush()
        os._exit(0)  # pyarrow/delta-rs may abort at interpreter shutdown (see deploy.cli.main)
    bench(args)


def bench(args: argparse.Namespace) -> None:
    import httpx

    from deploy.redis_server import ensure_embedded_redis, stop_embedded_redis
    from deploy.settings import load_settings

    tmp = None if args.data_dir else tempfile.TemporaryDirectory(prefix="query-bench-")
    data_dir = (args.data_dir or Path(tmp.name)).resolve()  # type: ignore[union-attr]
    data_dir.mkdir(parents=True, exist_ok=True)
    settings = load_settings(data_dir=data_dir, pipeline=PIPELINE)
    servers: dict[str, subprocess.Popen[bytes]] = {}
    logs = []
    try:
        redis_url = ensure_embedded_redis(settings.redis_dir)
        settings = load_settings(data_dir=data_dir, pipeline=PIPELINE, redis_url=redis_url)
        print(f"query benchmark: pipeline {PIPELINE}, view {VIEW}; {os.cpu_count()} cores; commit {_commit()}")
        print(f"  data {data_dir}; embedded Redis {redis_url}")

        # ---- setup: master dataset + one generation, Spark in a child process
        t0 = time.perf_counter()
        setup_log = data_dir / "setup.log"
        with setup_log.open("wb") as log:
            rc = subprocess.run([sys.executable, __file__, "--setup", str(data_dir), redis_url, "--lines", str(args.lines),
                                 "--vocab", str(args.vocab), "--seed", str(args.seed)], cwd=ROOT, stdout=log,
                                stderr=subprocess.STDOUT).returncode
        if rc != 0 or not (data_dir / "setup.json").exists():
            raise SystemExit(f"setup failed ({rc}): {setup_log.read_text()[-3000:]}")
        setup = json.loads((data_dir / "setup.json").read_text())
        counts: dict[str, int] = setup["counts"]
        keys = sorted(counts)
        print(f"  setup: {args.lines:,} lines, {setup['events']:,} events, {sum(counts.values()):,} words, "
              f"{len(keys)} distinct; generation {setup['generation']} published "
              f"(rows {setup['rows']}; run_batch {setup['seconds']:.1f} s incl. Spark start; "
              f"{time.perf_counter() - t0:.0f} s in all)")

        # ---- the two servers
        ports = {"A platform": _free_port(), "B bare": _free_port()}
        base_env = {k: v for k, v in os.environ.items() if not k.startswith("LAMBDA_")}
        env_a = {**base_env, "LAMBDA_DATA_DIR": str(data_dir), "LAMBDA_REDIS_URL": redis_url,
                 "LAMBDA_HTTP_HOST": HOST, "LAMBDA_HTTP_PORT": str(ports["A platform"]), "LAMBDA_PIPELINE": PIPELINE,
                 "LAMBDA_ENV_FILE": str(data_dir / "no.env")}
        commands = {
            "A platform": ([sys.executable, "-m", "deploy.cli", "serve"], env_a),
            "B bare": ([sys.executable, __file__, "--serve-bare", str(ports["B bare"]), redis_url], env_a),
        }
        for name, (argv, env) in commands.items():
            log_path = data_dir / f"server-{name.split()[0]}.log"
            log = log_path.open("wb")
            logs.append(log)
            servers[name] = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        _wait_up(f"http://{HOST}:{ports['A platform']}/readyz", servers["A platform"], data_dir / "server-A.log")
        _wait_up(f"http://{HOST}:{ports['B bare']}/healthz", servers["B bare"], data_dir / "server-B.log")
        paths = {"A platform": [f"/v1/views/{VIEW}/keys/{k}" for k in keys], "B bare": [f"/bare/{k}" for k in keys]}

        # ---- both answer, and answer right
        wrong = 0
        with httpx.Client(timeout=5) as http:
            for k in keys:
                a = http.get(f"http://{HOST}:{ports['A platform']}/v1/views/{VIEW}/keys/{k}")
                b = http.get(f"http://{HOST}:{ports['B bare']}/bare/{k}")
                if a.status_code != 200 or b.status_code != 200 or \
                        a.json()["value"]["count"] != counts[k] or b.json()["count"] != counts[k]:
                    wrong += 1
                    if wrong <= 3:
                        print(f"  ! {k}: expected {counts[k]}, A {a.status_code} {a.text[:150]}, B {b.status_code} {b.text[:150]}")
            sample = http.get(f"http://{HOST}:{ports['A platform']}{paths['A platform'][0]}").text
        print(f"  check: {len(keys) - wrong}/{len(keys)} keys answered with the expected count by both A and B")
        print(f"  A answers e.g. {sample}")
        print("  servers: A `python -m deploy.cli serve`, B `bare_app()` under uvicorn.run with deploy.cli's arguments; "
              "each 1 uvicorn worker on 127.0.0.1, both reading the same Redis over its Unix socket")
        print("  client: one load-generator process per run, raw asyncio protocols on uvloop, keep-alive HTTP/1.1, "
              "keys round-robin; it SHARES the machine's cores with both servers and Redis "
              f"({os.cpu_count()} cores here), so req/s are with the client's CPU taken out of the same budget")

        redis_pid = int((settings.redis_dir / "redis.pid").read_text())
        machine = Machine(redis_pid)
        pids = [p.pid for p in servers.values()]

        def spec(target: str, mode: str, connections: int, seconds: float, rate: float | None = None) -> dict[str, Any]:
            return {"port": ports[target], "paths": paths[target], "mode": mode, "connections": connections,
                    "seconds": seconds, "rate": rate}

        # ---- 1. saturation, closed loop, A B alternating
        print(f"\n1. saturation: closed loop, {args.connections} connections, {args.seconds:g} s per run, "
              f"{args.rounds} rounds A B (after {args.warmup:g} s untimed warm-up of each)")
        for target in ports:
            measure(machine, servers[target].pid, target, spec(target, "closed", args.connections, args.warmup))
        runs: dict[str, list[Run]] = {t: [] for t in ports}
        for rnd in range(1, args.rounds + 1):
            for target in ports:
                machine.wait_quiet(pids, args.quiet_cores, args.quiet_timeout)
                run = measure(machine, servers[target].pid, target, spec(target, "closed", args.connections, args.seconds))
                runs[target].append(run)
                print(f"  round {rnd}: {run.line()}", flush=True)
        med = {t: statistics.median(r.rps for r in rs) for t, rs in runs.items()}
        cpu = {t: statistics.median(r.per_req_us(r.server_cpu) for r in rs) for t, rs in runs.items()}
        ratio = med["A platform"] / med["B bare"]
        print(f"  median: A {med['A platform']:,.0f} req/s, B {med['B bare']:,.0f} req/s")
        print(f"  THROUGHPUT A/B = {ratio:.2f}   (target >= 0.80: {'met' if ratio >= 0.8 else 'NOT met'})")
        print(f"  server CPU per request: A {cpu['A platform']:.0f} us, B {cpu['B bare']:.0f} us; "
              f"B/A = {cpu['B bare'] / cpu['A platform']:.2f} (the throughput ratio a CPU-bound server would reach "
              "if each had a core to itself)")

        # ---- 2. half of saturation, open loop
        rate = args.half * med["A platform"]
        print(f"\n2. half of saturation: open loop at {rate:,.0f} req/s ({args.half:g} x A's median), "
              f"{args.open_connections} connections, {args.seconds:g} s; latency from the intended send time "
              "(and from the actual send)")
        half: dict[str, Run] = {}
        for target in ports:
            machine.wait_quiet(pids, args.quiet_cores, args.quiet_timeout)
            run = measure(machine, servers[target].pid, target,
                          spec(target, "open", args.open_connections, args.seconds, rate))
            half[target] = run
            r = run.result
            print(f"  {run.line()}")
            print(f"      from intended send: {_ms(r['latency'], 'p50', 'p95', 'p99', 'p999', 'max')}")
            print(f"      from actual send:   {_ms(r['service'], 'p50', 'p95', 'p99', 'p999', 'max')}")
            print(f"      client lateness:    {_ms(r['lag'], 'p50', 'p99', 'max')}")
        p99 = half["A platform"].result["latency"]["p99"] * 1e3
        print(f"  A p99 AT HALF SATURATION = {p99:.2f} ms   (target <= 5 ms: {'met' if p99 <= 5 else 'NOT met'}); "
              f"B at the same rate: p99 {half['B bare'].result['latency']['p99'] * 1e3:.2f} ms (reference)")

        # ---- 3. where A's time goes
        if args.profile or (args.profile is None and ratio < 0.8):
            port = _free_port()
            log_path = data_dir / "server-what-if.log"
            log = log_path.open("wb")
            logs.append(log)
            servers["A what-if"] = subprocess.Popen([sys.executable, __file__, "--serve-what-if"], cwd=ROOT,
                                                    env={**env_a, "LAMBDA_HTTP_PORT": str(port)},
                                                    stdout=log, stderr=subprocess.STDOUT)
            _wait_up(f"http://{HOST}:{port}/readyz", servers["A what-if"], log_path)
            whatifs = {"A' async deps": f"/v1/views/{VIEW}/keys/", "A'' Starlette": f"/fast/{VIEW}/keys/"}
            for target, prefix in whatifs.items():
                ports[target] = port
                paths[target] = [prefix + k for k in keys]
                with httpx.Client(timeout=5) as http:
                    answer = http.get(f"http://{HOST}:{port}{paths[target][0]}")
                    if answer.status_code != 200 or answer.json()["value"]["count"] != counts[keys[0]]:
                        raise SystemExit(f"the what-if server answers wrong: {answer.status_code} {answer.text[:300]}")
            print("\n3. where A's time goes. What-ifs over HTTP: A's server with its app changed in memory only "
                  "(product files untouched), `--serve-what-if`: A' = A's route with serving.api.deps.get_store/"
                  "get_pipeline made async (FastAPI runs sync dependencies in its thread pool); A'' = A's answer "
                  "(queries.key_answer + KeyAnswer JSON) on a plain Starlette Route in the same app (metrics "
                  "middleware kept; no FastAPI params/deps/auth). Closed loop as in 1, one run each, then B again.")
            for target in whatifs:
                measure(machine, servers["A what-if"].pid, target, spec(target, "closed", args.connections, args.warmup))
            what: dict[str, Run] = {}
            for target in [*whatifs, "B bare"]:
                machine.wait_quiet([*pids, servers["A what-if"].pid], args.quiet_cores, args.quiet_timeout)
                pid = servers["B bare" if target == "B bare" else "A what-if"].pid
                what[target] = measure(machine, pid, target, spec(target, "closed", args.connections, args.seconds))
                print(f"  {what[target].line()}", flush=True)
            for target in whatifs:
                print(f"  {target}/B = {what[target].rps / what['B bare'].rps:.2f} by req/s, "
                      f"{what['B bare'].per_req_us(what['B bare'].server_cpu) / what[target].per_req_us(what[target].server_cpu):.2f}"
                      f" by server CPU/req  (A as is: {ratio:.2f})")
            for target in list(servers):
                _stop(servers.pop(target))  # the in-process timing gets the cores to itself
            breakdown = _breakdown(settings, redis_url, keys, args.profile_requests, args.profile_requests)
            try:
                import uvloop  # the servers' loop

                uvloop.run(breakdown)
            except ImportError:
                asyncio.run(breakdown)
    finally:
        for proc in servers.values():
            _stop(proc)
        for log in logs:
            log.close()
        stop_embedded_redis(settings.redis_dir)
        if tmp is not None:
            tmp.cleanup()


if __name__ == "__main__":
    main()
