"""The query benchmark's load generator (a child process): a lean HTTP/1.1 client on raw asyncio
protocols over keep-alive connections, one request in flight per connection, closed or open loop."""

from __future__ import annotations

import asyncio
import collections
import json
import sys
import time
from typing import Any

from _harness import HOST, percentile


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
    summary = {name: percentile(values, q) for name, q in
               (("p50", 0.5), ("p90", 0.90), ("p95", 0.95), ("p99", 0.99), ("p999", 0.999))}
    return {**summary, "max": max(values, default=float("nan"))}


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


def run_loadgen(spec_json: str) -> None:
    spec = json.loads(spec_json)
    try:
        import uvloop

        result = uvloop.run(_loadgen(spec))
    except ImportError:
        result = asyncio.run(_loadgen(spec))
    print(json.dumps(result), flush=True)

