"""What the benchmark scripts share: ports, servers and child processes, an embedded Redis, the
commit measured, how busy the machine is, percentiles, medians and ratios.

The scripts import it as ``_harness`` (their own folder is first on ``sys.path`` when run as
``python benchmarks/<script>.py``). Nothing here changes what a benchmark measures: these are the
helpers each script used to carry a copy of.
"""

from __future__ import annotations

import os
import socket
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

HOST = "127.0.0.1"
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


# --------------------------------------------------------------------------- ports, servers, processes


def free_port(host: str = HOST) -> int:
    """A TCP port nobody listens on right now (the kernel's pick)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def wait_for(ready: Callable[[], Any], what: str, timeout: float = 60.0) -> None:
    """Poll ``ready()`` every 0.2 s until it is true; transport errors count as not yet. SystemExit after ``timeout``."""
    import httpx

    deadline = time.monotonic() + timeout
    while True:
        try:
            if ready():
                return
        except (httpx.TransportError, OSError):
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"{what} did not come up within {timeout:g}s")
        time.sleep(0.2)


def wait_up(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 90.0) -> None:
    """Wait until ``url`` answers 200; SystemExit with the log's tail if ``proc`` exits first."""
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
    raise SystemExit(f"{url} did not answer 200 within {timeout:g}s; see {log}")


def stop(proc: subprocess.Popen[Any] | None, timeout: float = 20.0) -> None:
    """SIGTERM ``proc`` and wait; SIGKILL it if it has not exited within ``timeout`` s."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextmanager
def embedded_redis(redis_dir: Path) -> Iterator[str]:
    """The platform's embedded Redis in ``redis_dir`` for the block; yields its URL, stops it after."""
    from deploy.runtime.redis_server import ensure_embedded_redis, stop_embedded_redis

    url = ensure_embedded_redis(redis_dir)
    try:
        yield url
    finally:
        stop_embedded_redis(redis_dir)


def git_commit(*folders: str, checkout: Path = ROOT) -> tuple[str, list[str]]:
    """(short HEAD of ``checkout``, default the one being run; tracked files under ``folders`` that differ from it)."""
    try:
        head = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        status = subprocess.run(["git", "-C", str(checkout), "status", "--porcelain", "--", *folders],
                                capture_output=True, text=True, check=True).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        return "unknown", []
    return head, [line[3:] for line in status if line.strip()]


# --------------------------------------------------------------------------- how busy the machine is


def machine_busy_seconds() -> float:
    """CPU seconds all processes of the machine have been busy (user, nice, system, irq, softirq, steal)."""
    import psutil

    t = psutil.cpu_times()
    return sum(getattr(t, name, 0.0) for name in ("user", "nice", "system", "irq", "softirq", "steal"))


def cpu_seconds(process: Any) -> float:
    """User + system CPU seconds of one ``psutil.Process``."""
    t = process.cpu_times()
    return t.user + t.system


def tree_cpu_seconds(extra_pids: Sequence[int] = ()) -> float:
    """CPU seconds of this process and its descendants (JVM, Python workers), plus ``extra_pids`` and
    theirs (Redis), waited-for children included (Linux /proc; 0 elsewhere)."""
    children: dict[int, list[int]] = defaultdict(list)
    cpu: dict[int, float] = {}
    for entry in Path("/proc").iterdir() if Path("/proc/stat").exists() else ():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:
            continue
        rest = text[text.rindex(")") + 2:].split()
        pid = int(entry.name)
        children[int(rest[1])].append(pid)
        cpu[pid] = sum(int(x) for x in rest[11:15]) / _CLOCK_TICKS  # utime stime cutime cstime
    total, todo = 0.0, [os.getpid(), *extra_pids]
    while todo:
        pid = todo.pop()
        total += cpu.get(pid, 0.0)
        todo.extend(children.get(pid, ()))
    return total


def others_cores(own: Callable[[], float], seconds: float) -> float:
    """Cores the machine's OTHER processes used over ``seconds`` s; ``own()`` is our CPU seconds so far."""
    t0, busy0, own0 = time.perf_counter(), machine_busy_seconds(), own()
    time.sleep(seconds)
    wall = time.perf_counter() - t0
    return max(0.0, (machine_busy_seconds() - busy0) - (own() - own0)) / wall


def wait_quiet(own: Callable[[], float], cores: float, timeout: float, *, say: bool = True,
               sample: float = 1.0) -> tuple[float, float]:
    """Before a timed run: wait (at most ``timeout`` s) until other processes use fewer than ``cores``.
    Returns (seconds waited, cores the others used in the last sample); ``say`` prints a line on timeout."""
    started = time.monotonic()
    while True:
        used = others_cores(own, sample)
        if used < cores:
            break
        if time.monotonic() - started > timeout:
            if say:
                print(f"  (other processes still use {used:.2f} cores after {timeout:g} s: measuring anyway)")
            break
    return time.monotonic() - started, used


# --------------------------------------------------------------------------- figures


def percentile(values: Sequence[float], q: float) -> float:
    """The value at rank ``int(q * n)`` of the sorted values (p50 = the upper median); NaN if none."""
    ordered = sorted(values) or [float("nan")]
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def medians(runs: dict[str, Sequence[float]]) -> dict[str, float]:
    return {name: statistics.median(values) for name, values in runs.items()}


def print_medians(title: str, runs: dict[str, Sequence[float]], *, baseline: str, unit: str = "s",
                  per_second: float | None = None, higher_is_better: bool = False) -> dict[str, float]:
    """A table of variants: median, each run, ratio to ``baseline``'s median. ``per_second``: also print
    that many items divided by the median (events/s). Returns the medians."""
    med = medians(runs)
    print(f"\n{title}")
    width = max(len(name) for name in runs)
    for name, values in runs.items():
        rate = f"  {per_second / med[name]:>12,.0f} /s" if per_second else ""
        each = " ".join(f"{v:,.2f}" for v in values)
        ratio = med[name] / med[baseline]
        print(f"  {name:<{width}}  median {med[name]:>10,.2f} {unit}{rate}   x{ratio:5.2f} of {baseline}"
              f"   runs: {each}")
    better = "higher" if higher_is_better else "lower"
    print(f"  ({len(next(iter(runs.values())))} runs each, medians; {better} is better)")
    sys.stdout.flush()
    return med


# --------------------------------------------------------------------------- whole commands side by side


def figure(pattern: str, text: str) -> float | None:
    """The first number ``pattern``'s group 1 captures in ``text`` (thousands commas allowed), or None."""
    import re

    match = re.search(pattern, text)
    return float(match.group(1).replace(",", "")) if match else None


def alternate(commands: dict[str, tuple[list[str], dict[str, str], Path]], figures: dict[str, str], *, repeat: int,
              log_dir: Path, timeout: float = 1800.0, optional: frozenset[str] = frozenset()
              ) -> dict[str, dict[str, list[float]]]:
    """Run each command (argv, environment, working folder) once per round, in the same order every
    round (A B A B ...), so drift on a shared machine hits each alike; read ``figures`` (name -> regex
    with one number group) from what each run printed; a run missing a figure not in ``optional`` stops
    the comparison. Every run's output is kept in ``log_dir``. Returns command -> figure -> values
    (an optional figure only from the runs that printed it).

    The working folder matters: Spark starts its Python workers with ``python -m`` in the driver's
    folder, so a project in that folder is imported before anything on ``PYTHONPATH``."""
    log_dir.mkdir(parents=True, exist_ok=True)
    found: dict[str, dict[str, list[float]]] = {name: {f: [] for f in figures} for name in commands}
    for round_ in range(1, repeat + 1):
        for name, (argv, env, cwd) in commands.items():
            log = log_dir / f"{name.replace(' ', '_').replace('/', '_')}-{round_}.log"
            started = time.perf_counter()
            with log.open("w") as out:
                rc = subprocess.run(argv, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT,
                                    timeout=timeout).returncode
            text = log.read_text()
            values = {f: figure(pattern, text) for f, pattern in figures.items()}
            missing = [f for f, v in values.items() if v is None and f not in optional]
            if rc != 0 or missing:
                raise SystemExit(f"{name} (round {round_}) exited {rc}, figures missing {missing}; see {log}")
            for f, v in values.items():
                if v is not None:
                    found[name][f].append(v)
            shown = ", ".join(f"{f} {v:,.2f}" for f, v in values.items() if v is not None)
            print(f"  round {round_} {name:<24} {shown}   ({time.perf_counter() - started:.0f} s)", flush=True)
    return found


# --------------------------------------------------------------------------- structured figures


def write_figures(path: Path, benchmark: str, figures: dict[str, Any]) -> None:
    """Write one benchmark's figures as JSON to ``path`` (what ``--json PATH`` of a script does), with the
    commit measured and the time; ``benchmarks/suite.py`` reads these rather than the printed text."""
    import json

    head, changed = git_commit("serving", "batch_layer", "speed_layer", "deploy", "shared_logic")
    record = {"benchmark": benchmark, "commit": head, "uncommitted": changed, "finished_at": time.time(),
              "figures": figures}
    path.write_text(json.dumps(record, indent=1, default=float))
