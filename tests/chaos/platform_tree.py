"""`lambda-platform up --no-generate` as a process tree the chaos harness can kill piece by piece.

Every process of the tree (``up``, the embedded Redis, the API, the speed layer, the scheduler,
their Spark JVMs and Python workers) inherits one environment variable naming this run
(``CHAOS_RUN=<uuid>``); the supervisor passes non-``LAMBDA_`` variables through and Spark's JVM
inherits its driver's environment. That marker, not a process name, is how processes are found,
so ``kill_all`` reaches every one of them, also the orphans a killed ``up`` leaves behind, and
never a process of anyone else on the machine. (Redis overwrites its environment with its
process title; it is found by its working directory, the data dir's ``redis`` folder.)

``kill_child`` sends SIGKILL to a supervised child and every process it started (its JVM,
PySpark's workers), as a crash of the part would end them.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import psutil

#: Roles of the supervised children, as the harness names them.
CHILD_ROLES = ("redis", "api", "speed", "scheduler")
_CLI_ROLES = {("serve",): "api", ("speed", "run"): "speed", ("batch", "schedule"): "scheduler"}
REPO_ROOT = Path(__file__).resolve().parents[2]
MARKER = "CHAOS_RUN"


@dataclass(frozen=True)
class UpConfig:
    """How `up` is started: data dir, port, API key and the few settings a 2-core machine needs."""

    data_dir: Path
    port: int
    api_key: str
    batch_schedule: str = "1h"
    speed_trigger_seconds: float = 0.5
    spark_master: str = "local[2]"
    shuffle_partitions: int = 2
    #: More settings for `up` (name, value), applied last: e.g. the README's Kafka section's ``export``.
    env: tuple[tuple[str, str], ...] = ()


class UpTree:
    """One `up` process and everything it starts; ``kill_all`` ends them all (idempotent)."""

    def __init__(self, config: UpConfig, log_path: Path) -> None:
        self.config, self.log_path = config, log_path
        self.run_id = uuid.uuid4().hex
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0
        #: Processes of the run still alive once `up` exited on SIGTERM (``stop``): none, if it stops everything.
        self.left_running: list[str] = []

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.config.port}"

    def env(self) -> dict[str, str]:
        """The environment `up` runs with (also what a command run beside it needs: the same data dir and keys)."""
        c = self.config
        env = {k: v for k, v in os.environ.items() if not k.startswith("LAMBDA_") and k != MARKER}
        env.update({
            MARKER: self.run_id,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])),
            "LAMBDA_DATA_DIR": str(c.data_dir), "LAMBDA_HTTP_PORT": str(c.port), "LAMBDA_PIPELINE": "wordcount",
            "LAMBDA_API_KEYS": json.dumps({c.api_key: ["read", "ingest", "admin"]}),
            "LAMBDA_BATCH_SCHEDULE": c.batch_schedule, "LAMBDA_SPARK_MASTER": c.spark_master,
            "LAMBDA_SPARK_SHUFFLE_PARTITIONS": str(c.shuffle_partitions),
            "LAMBDA_SPEED_TRIGGER_SECONDS": str(c.speed_trigger_seconds),
        })
        if "LAMBDA_SPARK_CLASS_ARCHIVE_DIR" in os.environ:  # a baseline without it: set it empty (benchmarks/chaos.py)
            env["LAMBDA_SPARK_CLASS_ARCHIVE_DIR"] = os.environ["LAMBDA_SPARK_CLASS_ARCHIVE_DIR"]
        env.update(c.env)
        return env

    def start(self) -> None:
        """Start `up` (its own session, output appended to ``log_path``)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            log.write(f"\n=== chaos harness: starting up (start {self.starts + 1}) at {time.ctime()} ===\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                [sys.executable, "-m", "deploy.cli", "up", "--no-generate"], env=self.env(), cwd=REPO_ROOT,
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            )
        self.starts += 1

    def up_exit_code(self) -> int | None:
        """None while `up` runs, else its exit status."""
        return None if self.process is None else self.process.poll()

    # -- finding processes -------------------------------------------------------------------

    def processes(self) -> list[psutil.Process]:
        """Every live process carrying this run's marker (zombies excluded)."""
        found = []
        for proc in psutil.process_iter(["pid", "status"]):
            if proc.info["status"] == psutil.STATUS_ZOMBIE or proc.pid == os.getpid():
                continue
            try:
                if proc.environ().get(MARKER) == self.run_id or self._is_our_redis(proc):
                    found.append(proc)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
                continue
        return found

    def _is_our_redis(self, proc: psutil.Process) -> bool:
        """Redis rewrites its process title over its environment, so it is known by its working
        directory instead: the embedded server runs in ``DATA_DIR/redis`` (``--dir``)."""
        return proc.name().startswith("redis-server") and Path(proc.cwd()) == self.redis_dir

    @property
    def redis_dir(self) -> Path:
        return self.config.data_dir.resolve() / "redis"

    def role(self, proc: psutil.Process) -> str | None:
        """'up', a child role (CHILD_ROLES), or None for helpers (JVMs, workers)."""
        try:
            if self.process is not None and proc.pid == self.process.pid:
                return "up"
            if proc.name().startswith("redis-server"):
                return "redis"
            cmd = proc.cmdline()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            return None
        if "deploy.cli" not in cmd:
            return None
        args = tuple(a for a in cmd[cmd.index("deploy.cli") + 1:] if not a.startswith("-"))
        return _CLI_ROLES.get(args[:2]) or _CLI_ROLES.get(args[:1])

    def children(self) -> dict[str, psutil.Process]:
        """The live supervised children by role (the session leader of each)."""
        found: dict[str, psutil.Process] = {}
        for proc in self.processes():
            role = self.role(proc)
            if role in CHILD_ROLES:
                found[role] = proc
        return found

    def child_pid(self, role: str) -> int | None:
        proc = self.children().get(role)
        return None if proc is None else proc.pid

    # -- faults and cleanup ------------------------------------------------------------------

    def kill_child(self, role: str) -> int | None:
        """SIGKILL the child ``role`` and all it started (JVM, Python workers); its pid, or None if not running.

        The whole tree dies, not just the process group: PySpark's worker daemon moves itself into a
        group of its own.
        """
        proc = self.children().get(role)
        if proc is None:
            return None
        try:
            victims = [proc, *proc.children(recursive=True)]
        except psutil.NoSuchProcess:
            return None
        for victim in victims:
            with contextlib.suppress(psutil.NoSuchProcess):
                victim.kill()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        return proc.pid

    def kill_all(self, timeout: float = 30.0) -> int:
        """SIGKILL every process of this run until none is left; returns how many were killed."""
        killed: set[int] = set()
        deadline = time.monotonic() + timeout
        while True:
            procs = self.processes()
            if self.process is not None and self.process.poll() is None:
                procs.append(psutil.Process(self.process.pid))
            if not procs:
                break
            for proc in procs:
                try:
                    proc.kill()
                    killed.add(proc.pid)
                except psutil.NoSuchProcess:
                    pass
            psutil.wait_procs(procs, timeout=2)
            if time.monotonic() > deadline:
                raise RuntimeError(f"processes of chaos run {self.run_id} survive SIGKILL: {[p.pid for p in procs]}")
        if self.process is not None:
            self.process.wait(10)
        return len(killed)

    def stop(self, grace: float = 180.0) -> float | None:
        """SIGTERM `up` and wait for it (seconds it took, None if it had to be killed); then kill leftovers,
        recording first in ``left_running`` what `up` left behind (each as "pid command")."""
        took = None
        if self.process is not None and self.process.poll() is None:
            began = time.monotonic()
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(grace)
                took = time.monotonic() - began
            except subprocess.TimeoutExpired:
                pass
        if took is not None:  # what `up` left behind (a child's last moments: a few seconds' grace)
            deadline = time.monotonic() + 10
            while (left := self.processes()) and time.monotonic() < deadline:
                time.sleep(0.5)
            self.left_running = [f"{p.pid} {' '.join(_cmdline(p))[:120]}" for p in left]
        self.kill_all()
        return took

    def rss_by_role(self) -> dict[str, int]:
        """Resident memory (bytes) per part, each counting what it started (JVM, workers); a process
        whose part is gone (its parent was killed) counts as 'orphan'."""
        totals: dict[str, int] = {}
        for proc in self.processes():
            try:
                owner = next((r for r in map(self.role, [proc, *proc.parents()]) if r), "orphan")
                totals[owner] = totals.get(owner, 0) + proc.memory_info().rss
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return totals


def _cmdline(proc: psutil.Process) -> list[str]:
    try:
        return proc.cmdline() or [proc.name()]
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return ["?"]
