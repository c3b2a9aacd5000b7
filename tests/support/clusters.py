"""A real standalone Spark cluster for tests: a master and 1-core workers on 127.0.0.1.

Every daemon is started from the pyspark wheel's own ``bin/spark-class`` in a process group of its
own, so a worker can be killed with everything it started (its executor JVM, their Python
workers) as when a machine dies, and ``stop`` leaves no JVM behind. The daemons get no
PYTHONPATH: executors see only what the job ships and what their own Python has installed.

A "bare" Python (``bare_python``) is a venv without pip whose site-packages holds a ``.pth`` line
naming the shared virtualenv's site-packages: the third-party packages import, but the project's
editable install (itself a ``.pth`` file in that folder, which Python does not process there) does not.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import sysconfig
import time
import urllib.request
from pathlib import Path
from typing import Any

import pyspark

from tests.support import free_port

SPARK_HOME = Path(pyspark.__file__).parent
_SCRUBBED = ("PYTHONPATH", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "VIRTUAL_ENV", "PYTHONHOME")


def daemon_env(**extra: str) -> dict[str, str]:
    """The environment of a Spark daemon: ours without Python paths, LAMBDA_ or SPARK_ variables."""
    env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED and not k.startswith(("LAMBDA_", "SPARK_"))}
    env.update({"SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": "127.0.0.1", **extra})
    return env


def bare_python(folder: Path) -> Path:
    """A Python with the shared virtualenv's third-party packages and without the project's code."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    python = folder / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True, env=daemon_env()).stdout.strip()
    Path(purelib, "shared-venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


def get_json(url: str, timeout: float = 30) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.load(response)


class StandaloneCluster:
    """``spark://127.0.0.1:port`` with ``workers`` workers of 1 core and ``memory`` each."""

    def __init__(self, workdir: Path, *, workers: int = 2, memory: str = "1g") -> None:
        self.workdir, self.worker_count, self.memory = workdir, workers, memory
        self.port, self.ui_port = free_port(), free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.worker_ui_ports: list[int] = []
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    def _daemon(self, name: str, *args: str) -> None:
        log = (self.workdir / f"{name}.log").open("ab")
        env = daemon_env(SPARK_LOG_DIR=str(self.workdir), SPARK_LOCAL_DIRS=str(self.workdir / f"{name}-tmp"),
                         SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false")  # no fixed port 6066
        self.processes[name] = subprocess.Popen(
            [str(SPARK_HOME / "bin" / "spark-class"), *args], env=env, cwd=self.workdir,
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )

    def start(self, timeout: float = 120) -> StandaloneCluster:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._daemon("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                     "--port", str(self.port), "--webui-port", str(self.ui_port))
        self._wait(lambda: self.master_json().get("status") == "ALIVE", "the master", timeout)
        for i in range(self.worker_count):
            ui = free_port()
            self.worker_ui_ports.append(ui)
            self._daemon(f"worker{i}", "org.apache.spark.deploy.worker.Worker", self.url, "--host", "127.0.0.1",
                         "--cores", "1", "--memory", self.memory, "--webui-port", str(ui),
                         "--work-dir", str(self.workdir / f"worker{i}-work"))
        self._wait(lambda: len(self.alive_workers()) == self.worker_count, "the workers", timeout)
        return self

    def _wait(self, check: Any, what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if check():
                    return
            except (OSError, ValueError):  # not up yet, or its UI answered a page before its JSON was ready
                pass
            dead = [name for name, p in self.processes.items() if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not start (dead: {dead}); logs in {self.workdir}")
            time.sleep(0.3)

    def master_json(self) -> dict[str, Any]:
        return get_json(f"http://127.0.0.1:{self.ui_port}/json/")

    def worker_json(self, i: int) -> dict[str, Any]:
        return get_json(f"http://127.0.0.1:{self.worker_ui_ports[i]}/json/")

    def alive_workers(self) -> list[dict[str, Any]]:
        return [w for w in self.master_json().get("workers", []) if w.get("state") == "ALIVE"]

    def kill(self, name: str) -> None:
        """SIGKILL the daemon ``name`` and everything it started (its process group)."""
        process = self.processes[name]
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait(30)

    def stop(self) -> None:
        for name in list(self.processes):
            self.kill(name)
