"""Soak: memory of every part of `lambda-platform up` over time, speed-layer restarts, graceful stop.

    python benchmarks/soak.py --duration 3600 --rate 50            # one hour at 50 events/s
    python benchmarks/soak.py --duration 600 --source /tmp/old     # the same against another checkout
    python benchmarks/soak.py --duration 300 --restarts 3          # then kill the speed layer 3 times
    python benchmarks/soak.py --duration 1800 --rate 100 --kafka   # events through the embedded Kafka broker

Starts `lambda-platform up` (wordcount, demo traffic at --rate, the `up` batch schedule) on a
temporary data dir and a free port, with the code of --source first on PYTHONPATH. Every
--interval seconds it samples per part: the RSS of the part's process and of its Spark driver JVM,
the JVM heap used/committed (`jstat -gc`), the PSS of the JVM's Python workers (they share
pages), the master version and the speed layer's lag. At the end: the samples, and per column
first, highest, last and the least-squares slope over the last half (MB per 10 minutes);
"levelled off" when that slope is under 2% of the last value (or 8 MB). --histogram / --nmt:
each JVM's top heap classes / native memory summary at the end.

--kafka: `up --no-generate` with the README's Kafka settings (the embedded broker, topic `words`) and
this script producing sample events into the topic at --rate (an idempotent producer); the Kafka
ingest (`kafka-ingest`) and the broker (`broker`) are sampled as parts too, with the ingest's lag.

--restarts N: kill -9 (or --restart-signal TERM) the speed layer N times and time, from the signal,
its exit, its successor's start, JVM, query start and first micro-batch (from its log), and fresh
answers: the API's answer version at least the master version when the new process started. Finally
`up` gets SIGTERM and the time each child takes to exit is printed. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import free_port

_ROOT = Path(__file__).resolve().parents[1]
_PARTS = {"serve": "api", "speed": "speed", "schedule": "scheduler", "generate": "generator", "redis": "redis",
          "ingest": "kafka-ingest", "broker": "broker"}
_TOPIC = "words"
_WORDS = ("the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "lambda", "kappa", "speed", "batch",
          "serving", "view", "window", "session", "merge", "exact", "version", "barrier")
MB = 1024 * 1024


def _part_of(proc: psutil.Process) -> str | None:
    try:
        cmd = " ".join(proc.cmdline())
    except psutil.Error:
        return None
    if "redis-server" in cmd:
        return "redis"
    words = cmd.split()
    for word, part in _PARTS.items():
        if word in words:
            return part
    return None


def _parts(up: psutil.Process) -> dict[str, psutil.Process]:
    found: dict[str, psutil.Process] = {}
    for child in up.children():
        part = _part_of(child)
        if part is not None:
            found[part] = child
    return found


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _jvm_of(proc: psutil.Process) -> psutil.Process | None:
    try:
        return next((p for p in proc.children(recursive=True) if p.name() == "java"), None)
    except psutil.Error:
        return None


def _rss(proc: psutil.Process | None) -> float | None:
    try:
        return proc.memory_info().rss / MB if proc is not None else None
    except psutil.Error:
        return None


def _pss(proc: psutil.Process) -> float:
    """Proportional set size in MB: forked workers share pages with their daemon, so RSS would count them twice."""
    try:
        return proc.memory_full_info().pss / MB
    except (psutil.Error, AttributeError):
        return 0.0


def _heap(jvm: psutil.Process) -> tuple[float, float] | None:
    """(used, committed) heap in MB, from jstat -gc; None when the JVM does not answer."""
    try:
        out = subprocess.run(["jstat", "-gc", str(jvm.pid)], capture_output=True, text=True, timeout=10, check=False).stdout
        names, values = out.split("\n")[:2]
    except (ValueError, subprocess.SubprocessError, OSError):
        return None
    gc = {name: float(v) for name, v in zip(names.split(), values.split()) if v.replace(".", "", 1).isdigit()}
    if "OU" not in gc:
        return None
    used = sum(gc.get(k, 0.0) for k in ("S0U", "S1U", "EU", "OU"))
    committed = sum(gc.get(k, 0.0) for k in ("S0C", "S1C", "EC", "OC"))
    return used / 1024, committed / 1024


def sample(up: psutil.Process) -> dict[str, float | None]:
    """One row: MB per part and process kind."""
    row: dict[str, float | None] = {}
    for part, proc in sorted(_parts(up).items()):
        row[f"{part}.py" if part != "redis" else "redis"] = _rss(proc)
        jvm = _jvm_of(proc)
        if jvm is None:
            continue
        row[f"{part}.jvm"] = _rss(jvm)
        heap = _heap(jvm)
        if heap is not None:
            row[f"{part}.heap"], row[f"{part}.heapC"] = heap
        try:
            workers = [p for p in jvm.children(recursive=True) if p.name().startswith("python")]
            row[f"{part}.workers"] = sum(_pss(w) for w in workers)
        except psutil.Error:
            pass
    return row


class Platform:
    """`lambda-platform up` in a data dir, reached over HTTP."""

    def __init__(self, source: Path, data_dir: Path, rate: float, nmt: bool, kafka_port: int | None = None) -> None:
        self.data_dir, self.port, self.kafka_port = data_dir, free_port(), kafka_port
        env = {k: v for k, v in os.environ.items() if not k.startswith("LAMBDA_")}
        env.update(PYTHONPATH=str(source), LAMBDA_HTTP_PORT=str(self.port), LAMBDA_GENERATE_RATE=str(rate))
        if kafka_port is not None:  # the README's Kafka section's settings
            env.update(LAMBDA_KAFKA_BOOTSTRAP_SERVERS="embedded", LAMBDA_KAFKA_TOPICS=_TOPIC,
                       LAMBDA_KAFKA_EMBEDDED_PORT=str(kafka_port))
        if nmt:
            env["JAVA_TOOL_OPTIONS"] = "-XX:NativeMemoryTracking=summary"
        self.log = (data_dir / "up.out").open("ab")
        command = [sys.executable, "-m", "deploy.cli", "--data-dir", str(data_dir), "up"]
        self.proc = subprocess.Popen(command + (["--no-generate"] if kafka_port is not None else []),
                                     cwd=source, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        self.up = psutil.Process(self.proc.pid)
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=5)

    def wait_ready(self, timeout: float = 3600) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"`up` exited with {self.proc.returncode}; see {self.data_dir / 'up.out'}")
            views = self.views()
            if views and views.get("processed_version") is not None and {"speed", "scheduler"} <= set(_parts(self.up)):
                return
            time.sleep(1)
        raise SystemExit(f"the platform was not ready within {timeout:.0f}s; see {self.data_dir / 'logs'}")

    def views(self) -> dict | None:
        key = (self.data_dir / "local_api_key")
        headers = {"Authorization": f"Bearer {key.read_text().strip()}"} if key.exists() else {}
        try:
            response = self.http.get("/v1/views", headers=headers)
            return response.json() if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None

    def stop(self) -> dict[str, float]:
        """SIGTERM `up`; seconds until each child and `up` itself exited."""
        children = _parts(self.up)
        started, gone = time.monotonic(), {}
        self.proc.send_signal(signal.SIGTERM)
        while self.proc.poll() is None or len(gone) < len(children):
            for part, proc in children.items():
                if part not in gone and not _alive(proc):
                    gone[part] = time.monotonic() - started
            if self.proc.poll() is not None:
                gone.setdefault("up", time.monotonic() - started)
                for part in children:
                    gone.setdefault(part, time.monotonic() - started)
            time.sleep(0.05)
        self.log.close()
        return gone


def restart_speed(platform: Platform, sig: signal.Signals) -> dict[str, float]:
    """Signal the speed layer; seconds from the signal to: its exit, its successor's start, JVM, query
    started and first micro-batch (from its log), and fresh answers."""
    views = platform.views() or {}
    target = views.get("latest_version") or 0
    old = _parts(platform.up)["speed"]
    log = platform.data_dir / "logs" / "speed.log"
    offset = log.stat().st_size if log.exists() else 0
    t0, times = time.monotonic(), {}
    old.send_signal(sig)
    while time.monotonic() - t0 < 900:
        now = time.monotonic() - t0
        if "exited" not in times and not _alive(old):
            times["exited"] = now
        new = _parts(platform.up).get("speed")
        if new is not None and new.pid != old.pid:
            if "started" not in times:  # fresh: also holds what was committed while it was down
                times["started"], target = now, max(target, (platform.views() or {}).get("latest_version") or 0)
            if "jvm" not in times and _jvm_of(new) is not None:
                times["jvm"] = now
            with log.open("rb") as f:
                f.seek(offset)
                text = f.read().decode(errors="replace")
            if "query_started" not in times and " running (query" in text:
                times["query_started"] = now
            if "first_batch" not in times and "micro-batch " in text.split(" running (query", 1)[-1]:
                times["first_batch"] = now
        answer = platform.views() or {}
        versions = [v.get("version") or 0 for v in answer.get("views", [])]
        if "started" in times and versions and min(versions) >= target:
            times["fresh"] = now
            return times
        time.sleep(0.2)
    return times


def _disk(folder: Path) -> float:
    """MB of files under ``folder`` (Spark's shuffle and broadcast files)."""
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / MB if folder.exists() else 0.0


def _accepted(data_dir: Path) -> int:
    """Events the demo traffic got acknowledged so far (from its log, written every 10 s)."""
    log = data_dir / "logs" / "generator.log"
    counts = re.findall(r"demo traffic: (\d+) events accepted", log.read_text(errors="replace")) if log.exists() else []
    return int(counts[-1]) if counts else 0


def _kafka_status(platform: Platform) -> dict[str, float]:
    """The Kafka ingest's records appended and its lag over all partitions, from the API's /metrics."""
    try:
        text = httpx.get(f"http://127.0.0.1:{platform.port}/metrics", timeout=10).text
    except httpx.HTTPError:
        return {}
    appended = re.findall(r'^lambda_kafka_ingest_records_total\{[^}]*outcome="appended"[^}]*\} (\S+)', text, re.M)
    lags = re.findall(r"^lambda_kafka_ingest_lag_records\{[^}]*\} (\S+)", text, re.M)
    found = {"kafka_appended": float(appended[0])} if appended else {}
    return {**found, "kafka_lag": sum(float(v) for v in lags)} if lags else found


def _slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, MB), as MB per 10 minutes."""
    n = len(points)
    if n < 2:
        return 0.0
    mx, my = sum(p[0] for p in points) / n, sum(p[1] for p in points) / n
    var = sum((p[0] - mx) ** 2 for p in points)
    return 600 * sum((p[0] - mx) * (p[1] - my) for p in points) / var if var else 0.0


def report(samples: list[tuple[float, dict]], out=sys.stdout) -> None:
    columns = sorted({c for _, row in samples for c in row})
    print("\nMB by minute (py: the part's process RSS, jvm: its driver JVM's RSS, heap/heapC: JVM heap used/"
          "committed, workers: its Python workers' PSS)", file=out)
    print(f"{'min':>6} " + " ".join(f"{c:>17}" for c in columns), file=out)
    for t, row in samples:
        cells = (f"{row[c]:17.0f}" if row.get(c) is not None else f"{'-':>17}" for c in columns)
        print(f"{t / 60:6.1f} " + " ".join(cells), file=out)
    print(f"\n{'column':>17} {'first':>7} {'max':>7} {'last':>7} {'slope, last half (MB/10min)':>28}  levelled off",
          file=out)
    half = samples[-1][0] / 2 if samples else 0
    for c in columns:
        points = [(t, row[c]) for t, row in samples if row.get(c) is not None]
        if not points:
            continue
        late = [p for p in points if p[0] >= half]
        slope, last = _slope(late), points[-1][1]
        flat = slope < max(8.0, 0.02 * last)
        print(f"{c:>17} {points[0][1]:7.0f} {max(p[1] for p in points):7.0f} {last:7.0f} {slope:28.1f}  "
              f"{'yes' if flat else 'NO'}", file=out)


def _jvm_reports(platform: Platform, histogram: bool, nmt: bool) -> None:
    for part, proc in sorted(_parts(platform.up).items()):
        jvm = _jvm_of(proc)
        if jvm is None:
            continue
        commands = ([["GC.class_histogram"]] if histogram else []) + ([["VM.native_memory", "summary"]] if nmt else [])
        for command in commands:
            out = subprocess.run(["jcmd", str(jvm.pid), *command], capture_output=True, text=True, timeout=120,
                                 check=False).stdout
            lines = out.splitlines()
            print(f"\n--- {part} JVM (pid {jvm.pid}): jcmd {' '.join(command)}")
            print("\n".join(lines[:22] if command[0] == "GC.class_histogram" else lines[:60]))


class _Feeder(threading.Thread):
    """Sample wordcount events into the embedded broker's topic at ``rate`` per second (idempotent producer)."""

    def __init__(self, port: int, rate: float) -> None:
        super().__init__(daemon=True)
        from confluent_kafka import Producer

        self.producer = Producer({"bootstrap.servers": f"127.0.0.1:{port}", "enable.idempotence": True,
                                  "linger.ms": 20})
        self.rate, self.sent, self.stop = rate, 0, threading.Event()

    def run(self) -> None:
        rng, started = random.Random(7), time.monotonic()
        while not self.stop.is_set():
            due = int((time.monotonic() - started) * self.rate)
            for _ in range(due - self.sent):
                text = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 6)))
                self.producer.produce(_TOPIC, json.dumps({"text": text}).encode())
                self.sent += 1
            self.producer.poll(0)
            time.sleep(0.05)
        self.producer.flush(30)


def _soak(platform: Platform, args: argparse.Namespace, results: dict) -> list[tuple[float, dict]]:
    """Wait until the platform serves, then sample for ``args.duration`` seconds."""
    t_ready, samples = time.monotonic(), []
    platform.wait_ready()
    print(f"ready after {time.monotonic() - t_ready:.0f}s", flush=True)
    feeder = _Feeder(platform.kafka_port, args.rate) if platform.kafka_port is not None else None
    if feeder is not None:
        feeder.start()
    t0, accepted0 = time.monotonic(), _accepted(platform.data_dir)
    while time.monotonic() - t0 < args.duration:
        row = sample(platform.up)
        views = platform.views() or {}
        row["master_version"], row["lag_versions"] = views.get("latest_version"), views.get("lag_versions")
        row["spark_tmp_disk"] = _disk(platform.data_dir / "spark-tmp")
        if feeder is not None:
            row.update(_kafka_status(platform))
        samples.append((time.monotonic() - t0, row))
        print(f"{(time.monotonic() - t0) / 60:5.1f} min  " + "  ".join(
            f"{k} {v:.0f}" for k, v in sorted(row.items()) if v is not None), flush=True)
        time.sleep(max(0.0, args.interval - (time.monotonic() - t0) % args.interval))
    if feeder is not None:
        feeder.stop.set()
        feeder.join(60)
        results["achieved_rate"] = feeder.sent / (time.monotonic() - t0)
        print(f"produced {feeder.sent} records into {_TOPIC}: {results['achieved_rate']:.1f}/s (asked for {args.rate:g}); "
              f"the ingest appended {_kafka_status(platform).get('kafka_appended')}")
    else:
        results["achieved_rate"] = (_accepted(platform.data_dir) - accepted0) / (time.monotonic() - t0)
        print(f"demo traffic acknowledged {results['achieved_rate']:.1f} events/s on average (asked for {args.rate:g})")
    _jvm_reports(platform, args.histogram, args.nmt)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=3600, help="seconds of soak after start-up (3600)")
    parser.add_argument("--rate", type=float, default=50, help="demo traffic, events per second (50)")
    parser.add_argument("--interval", type=float, default=30, help="seconds between samples (30)")
    parser.add_argument("--restarts", type=int, default=0, help="speed-layer restarts to time after the soak (0)")
    parser.add_argument("--restart-signal", choices=("KILL", "TERM"), default="KILL",
                        help="signal for --restarts: KILL (a crash) or TERM (a graceful restart)")
    parser.add_argument("--source", type=Path, default=_ROOT, help="checkout whose code runs (this one)")
    parser.add_argument("--data-dir", type=Path, help="data dir (default: a temporary one, deleted after)")
    parser.add_argument("--histogram", action="store_true", help="print each JVM's top heap classes at the end")
    parser.add_argument("--nmt", action="store_true", help="JVMs with native memory tracking; print summaries")
    parser.add_argument("--json", type=Path, help="also write the samples and timings to this file")
    parser.add_argument("--kafka", action="store_true", help="events through the embedded Kafka broker (see above)")
    args = parser.parse_args()

    data_dir = args.data_dir or Path(tempfile.mkdtemp(prefix="soak-"))
    data_dir.mkdir(parents=True, exist_ok=True)
    commit = subprocess.run(["git", "-C", str(args.source), "rev-parse", "--short", "HEAD"], capture_output=True, check=False,
                            text=True).stdout.strip()
    print(f"soak: {args.duration:.0f}s at {args.rate:g} events/s, code {args.source} ({commit or 'not a git checkout'}),"
          f" data {data_dir}", flush=True)
    platform = Platform(args.source.resolve(), data_dir, args.rate, args.nmt, free_port() if args.kafka else None)
    samples: list[tuple[float, dict]] = []
    results: dict[str, object] = {"rate": args.rate, "source": str(args.source), "commit": commit}
    try:
        samples.extend(_soak(platform, args, results))
        for i in range(args.restarts):
            times = restart_speed(platform, signal.Signals[f"SIG{args.restart_signal}"])
            print(f"speed restart {i + 1}: " + ", ".join(f"{k} {v:.1f}s" for k, v in times.items()), flush=True)
            results.setdefault("restarts", []).append(times)  # type: ignore[union-attr]
            time.sleep(65)  # up for over a minute: the supervisor's backoff is back at 0.5 s
    finally:
        stopped = platform.stop() if platform.proc.poll() is None else {}
        print("stop (SIGTERM to up): " + ", ".join(f"{k} {v:.1f}s" for k, v in sorted(stopped.items(),
                                                                                      key=lambda kv: kv[1])))
        results["stop"] = stopped
        report(samples)
        if args.json:
            args.json.write_text(json.dumps({**results, "samples": samples}, indent=1))
        if args.data_dir is None:
            shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
