"""A small process supervisor: the parts of the platform as child processes, restarted when they die.

Each child is a ``lambda-platform`` command (or the embedded Redis server) with its output
appended to ``DATA_DIR/logs/<name>.log`` (a private file, 0600, in a private folder). A child that exits is restarted after an exponential
backoff (0.5 s doubling to 30 s, reset once it has stayed up for a minute). ``stop`` ends the
children in two steps: first every child not marked ``stop_last``, all at once (each finishes its
own work in parallel, so a stop takes as long as the slowest child, not the sum), then the
``stop_last`` ones (e.g. Redis, which the others write to until they exit) in reverse start order.
Each gets SIGTERM, then SIGKILL of its process group after the grace period.
"""

from __future__ import annotations

import contextlib
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


def _exit(code: int | None) -> str:
    """A child's exit as people read it: uvicorn, for one, re-raises SIGTERM after its graceful shutdown."""
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f"ended by {signal.Signals(-code).name}"
    return f"exit {code}"


@dataclass
class Child:
    """One supervised process."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    restart: bool = True
    #: Stopped after every other child (something the others need while they stop).
    stop_last: bool = False
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
        self.signal_stop()
        self.wait_stopped(time.monotonic() + grace)

    def signal_stop(self) -> None:
        """SIGTERM, if running; ``wait_stopped`` then waits for the exit."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def wait_stopped(self, deadline: float) -> None:
        """Wait for the exit until ``deadline`` (monotonic), then SIGKILL the child's process group."""
        if self.process is None:
            return
        try:
            self.process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.warning("%s did not stop within the grace period; killing it", self.name)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)
        log.info("stopped %s (%s)", self.name, _exit(self.process.returncode))
        if self._log_file is not None:
            self._log_file.close()  # type: ignore[attr-defined]
            self._log_file = None


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
                log.warning("%s ended (%s) after %.1fs; restarting in %.1fs (see %s)",
                            child.name, _exit(child.process.returncode), up_for, delay, child.log_path)
            elif now >= child.next_start:
                child.restarts += 1
                child.next_start = 0.0
                child.start()

    def stop(self, grace: float = 60.0) -> None:
        """Stop every child: the others all at once, then the ``stop_last`` ones one by one; each within ``grace`` s."""
        first = [c for c in reversed(self.children) if not c.stop_last]
        for child in first:
            child.signal_stop()
        deadline = time.monotonic() + grace
        for child in first:
            child.wait_stopped(deadline)
        for child in reversed(self.children):
            if child.stop_last:
                child.stop(grace)
