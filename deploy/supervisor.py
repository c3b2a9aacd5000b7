"""A small process supervisor: the parts of the platform as child processes, restarted when they die.

Each child is a ``lambda-platform`` command (or the embedded Redis server) with its output
appended to ``DATA_DIR/logs/<name>.log`` (a private file, 0600, in a private folder). A child that exits is restarted after an exponential
backoff (0.5 s doubling to 30 s, reset once it has stayed up for a minute). ``stop`` ends the
children in reverse start order: SIGTERM, then SIGKILL after a grace period.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from deploy.settings import private_dir

log = logging.getLogger(__name__)

_BACKOFF_MAX, _STABLE_AFTER = 30.0, 60.0


@dataclass
class Child:
    """One supervised process."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    restart: bool = True
    #: The child's umask (None: this process's).
    umask: int | None = None
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    restarts: int = 0
    next_start: float = 0.0
    _log_file: object = field(default=None, repr=False)

    def start(self) -> None:
        private_dir(self.log_path.parent)
        if self._log_file is not None:  # a restart: the previous process's handle
            self._log_file.close()  # type: ignore[attr-defined]
        fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._log_file = os.fdopen(fd, "ab")
        self.process = subprocess.Popen(
            self.argv, env=self.env, stdout=self._log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl-C reaches the supervisor only; it stops children in order
            umask=-1 if self.umask is None else self.umask,
        )
        self.started_at = time.monotonic()
        log.info("started %s (pid %d), log %s", self.name, self.process.pid, self.log_path)

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, grace: float) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(grace)
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop within %.0fs; killing it", self.name, grace)
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)
        log.info("stopped %s (exit %s)", self.name, self.process.returncode)
        if self._log_file is not None:
            self._log_file.close()  # type: ignore[attr-defined]


class Supervisor:
    """Starts children in order, restarts the ones that die, stops them all on request."""

    def __init__(self, children: list[Child]) -> None:
        self.children = children

    def start(self) -> None:
        for child in self.children:
            child.start()

    def watch_once(self) -> None:
        """Restart children that exited (after their backoff)."""
        now = time.monotonic()
        for child in self.children:
            if child.running or child.process is None or not child.restart:
                continue
            if child.next_start == 0.0:
                up_for = now - child.started_at
                if up_for > _STABLE_AFTER:
                    child.restarts = 0
                delay = min(_BACKOFF_MAX, 0.5 * 2 ** child.restarts)
                child.next_start = now + delay
                log.warning("%s exited with %s after %.1fs; restarting in %.1fs (see %s)",
                            child.name, child.process.returncode, up_for, delay, child.log_path)
            elif now >= child.next_start:
                child.restarts += 1
                child.next_start = 0.0
                child.start()

    def stop(self, grace: float = 60.0) -> None:
        for child in reversed(self.children):
            child.stop(grace)
