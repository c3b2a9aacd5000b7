"""The query benchmark's measurements: one load-generator process against one server, with the CPU of
the server, Redis, the client and every other process sampled around the load only."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _harness import ROOT, cpu_seconds, machine_busy_seconds, wait_quiet

SCRIPT = Path(__file__).with_name("query_bench.py")  # the load generator is `query_bench.py --loadgen SPEC`


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

    _cpu = staticmethod(cpu_seconds)

    @staticmethod
    def busy() -> float:
        return machine_busy_seconds()

    def wait_quiet(self, exclude: list[int], cores: float, timeout: float) -> None:
        procs = [self.psutil.Process(pid) for pid in exclude] + [self.redis, self.me]
        wait_quiet(lambda: sum(cpu_seconds(p) for p in procs), cores, timeout)


def measure(machine: Machine, server_pid: int, target: str, spec: dict[str, Any]) -> Run:
    """One load-generator process against one server; CPU sampled around the load only."""
    server = machine.psutil.Process(server_pid)
    gen = subprocess.Popen([sys.executable, str(SCRIPT), "--loadgen", json.dumps(spec)], cwd=ROOT,
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


def ms(summary: dict[str, float], *names: str) -> str:
    return "  ".join(f"{n} {summary[n] * 1e3:6.2f}" for n in names) + " ms"

