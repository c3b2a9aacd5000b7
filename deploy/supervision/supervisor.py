"""A small process supervisor: the parts of the platform as child processes, restarted when they die.

Each child is a ``lambda-platform`` command (or the embedded Redis server) with its output
appended to ``DATA_DIR/logs/<name>.log`` (a private file, 0600, in a private folder). A child that exits is restarted after an exponential
backoff (0.5 s doubling to 30 s, reset once it has stayed up for a minute). A child ended from outside (SIGKILL,
SIGTERM, SIGINT or SIGHUP: an operator, the OOM killer, a chaos test) after it had been up ``_KILLED_AFTER`` s is
no crash loop: it is restarted after the shortest delay, and its backoff starts over. (Otherwise a part killed
every minute or so waits up to 30 s more each time before it even starts: a speed layer's answers stay stale
that much longer.) ``stop`` ends the
children in two steps: first every child not marked ``stop_last``, all at once (each finishes its
own work in parallel, so a stop takes as long as the slowest child, not the sum), then the
``stop_last`` ones (e.g. Redis, which the others write to until they exit) in reverse start order.
Each gets SIGTERM, then SIGKILL of its process group after the grace period.

While it runs, the supervisor keeps a record of its children in ``STATE_FILE`` beside their logs
(rewritten atomically, 0600, whenever a child exits or starts; removed on stop): each one's pid,
whether it runs, its restarts, its last exit and the last error line of its log, and how many
times it failed since it last stayed up ``_STABLE_AFTER`` s. ``lambda-platform status`` reads it
(``read_children``) to show a restarting child as failing. An exit for changed pipeline code
(``EXIT_CODE_CHANGED``) is a planned restart, not a failure.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from deploy.data_dir import private_dir
from deploy.supervision.code_watch import EXIT_CODE_CHANGED
from serving.store.heartbeat import short_error

log = logging.getLogger(__name__)

_BACKOFF_MAX, _STABLE_AFTER = 30.0, 60.0
#: Signals that end a process from outside, not a failure of its own (an exit status, SIGSEGV, SIGABRT).
_FROM_OUTSIDE = frozenset({-signal.SIGKILL, -signal.SIGTERM, -signal.SIGINT, -signal.SIGHUP})
#: A child ended from outside sooner than this after its start (again and again, say) backs off like a failing one.
_KILLED_AFTER = 5.0
#: The supervisor's record of its children, in their log folder.
STATE_FILE = "children.json"
#: How much of a child's log is read for its last error line.
_TAIL_BYTES = 16384
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_NAMES_ERROR = re.compile(r"(?:Error|Exception)\b|\b(?:ERROR|FATAL|Traceback)\b")


def _exit(code: int | None) -> str:
    """A child's exit as people read it: a negative status (the child died of a signal) by the signal's name."""
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f"ended by {signal.Signals(-code).name}"
    return f"exit {code}"


def last_error_line(log_path: Path) -> str | None:
    """The last error the tail of a child's log tells, in one line (``short_error``), or None.

    The command line's report (``error: ...``, wrapped over several lines) wins; else the last line
    naming an error; else the last line.
    """
    try:
        with log_path.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - _TAIL_BYTES))
            tail = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    lines = [_ANSI.sub("", line).rstrip() for line in tail.splitlines()]
    lines = [line for line in lines if line.strip()]
    reports = [i for i, line in enumerate(lines) if line.startswith("error:")]
    if reports:
        return short_error(" ".join(line.strip() for line in lines[reports[-1]:]))
    named = [line for line in lines if _NAMES_ERROR.search(line)]
    return short_error((named or lines)[-1]) if lines else None


@dataclass(frozen=True)
class ChildState:
    """What the supervisor last recorded of a child (``read_children``)."""

    name: str
    pid: int | None
    running: bool
    up_since: float | None
    """When its current (or last) process started (epoch s)."""
    restarts: int
    """Restarts since the supervisor started."""
    failures: int
    """Failed exits since it last stayed up ``_STABLE_AFTER`` s (0: none, or a planned restart)."""
    last_exit: str | None
    last_exit_at: float | None
    last_error: str | None

    def failing(self, now: float | None = None) -> bool:
        """It failed and has not stayed up ``_STABLE_AFTER`` s since: waiting to restart, or restarted lately."""
        now = time.time() if now is None else now
        return self.failures > 0 and (not self.running or self.up_since is None or now - self.up_since < _STABLE_AFTER)

    def failure(self) -> str:
        """``exit 1, 3 failures since it last stayed up 60s (12 restarts): <last error line>``."""
        return (f"{self.last_exit}, {self.failures} failure{'s' if self.failures != 1 else ''} since it last stayed up "
                f"{_STABLE_AFTER:.0f}s ({self.restarts} restart{'s' if self.restarts != 1 else ''})"
                + (f": {self.last_error}" if self.last_error else ""))


def read_children(logs_dir: Path) -> dict[str, ChildState] | None:
    """The children a running supervisor recorded in ``logs_dir``; None when none is running there."""
    try:
        record = json.loads((logs_dir / STATE_FILE).read_text())
        pid = int(record["pid"])
        os.kill(pid, 0)
        return {name: ChildState(name=name, **fields) for name, fields in record["children"].items()}
    except PermissionError:  # alive, another user's: cannot happen with a 0700 folder, read nothing
        return None
    except (OSError, ValueError, KeyError, TypeError):  # none recorded, unreadable, or its supervisor is gone
        return None


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
    #: Restarts since the supervisor started (``restarts`` goes back to 0 once the child stays up).
    total_restarts: int = 0
    #: Failed exits since the child last stayed up ``_STABLE_AFTER`` s.
    failures: int = 0
    last_exit: str | None = None
    last_exit_at: float | None = None
    last_error: str | None = None
    started_wall: float | None = None
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
        self.started_at, self.started_wall = time.monotonic(), time.time()
        log.info("started %s (pid %d), log %s", self.name, self.process.pid, self.log_path)

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def state(self) -> ChildState:
        return ChildState(name=self.name, pid=self.process.pid if self.process else None, running=self.running,
                          up_since=self.started_wall, restarts=self.total_restarts, failures=self.failures,
                          last_exit=self.last_exit, last_exit_at=self.last_exit_at, last_error=self.last_error)

    def record_exit(self, up_for: float) -> None:
        """Record the exit just seen: how, when, the last error of its log, and whether it counts as a failure."""
        assert self.process is not None
        code = self.process.returncode
        self.last_exit, self.last_exit_at = _exit(code), time.time()
        self.last_error = last_error_line(self.log_path)
        if code == EXIT_CODE_CHANGED:
            self.failures = 0
        else:
            self.failures = 1 if up_for > _STABLE_AFTER else self.failures + 1

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

    def __init__(self, children: list[Child], state_path: Path | None = None) -> None:
        self.children = children
        #: Where the children's record goes (None: ``STATE_FILE`` beside the first child's log).
        self.state_path = state_path
        self._recorded = False

    def start(self) -> None:
        for child in self.children:
            child.start()
        self.record()

    def watch_once(self) -> None:
        """Restart children that exited (after their backoff); record what changed."""
        now = time.monotonic()
        changed = not self._recorded
        for child in self.children:
            if child.running or child.process is None or not child.restart:
                continue
            if child.next_start == 0.0:
                changed = True
                up_for = now - child.started_at
                killed = child.process.returncode in _FROM_OUTSIDE and up_for > _KILLED_AFTER
                if up_for > _STABLE_AFTER or killed:
                    child.restarts = 0
                child.record_exit(up_for)
                delay = min(_BACKOFF_MAX, 0.5 * 2 ** child.restarts)
                child.next_start = now + delay
                log.warning("%s ended (%s) after %.1fs; restarting in %.1fs (see %s)",
                            child.name, child.last_exit, up_for, delay, child.log_path)
            elif now >= child.next_start:
                changed = True
                child.restarts += 1
                child.total_restarts += 1
                child.next_start = 0.0
                child.start()
        if changed:
            self.record()

    def _path(self) -> Path | None:
        if self.state_path is not None:
            return self.state_path
        return self.children[0].log_path.parent / STATE_FILE if self.children else None

    def record(self) -> None:
        """Write the children's record (``read_children`` reads it): atomically, private (0600)."""
        path = self._path()
        if path is None:
            return
        record = {"pid": os.getpid(), "written_at": time.time(),
                  "children": {c.name: {k: v for k, v in asdict(c.state()).items() if k != "name"}
                               for c in self.children}}
        partial = path.with_name(f".{path.name}.{os.getpid()}")
        self._recorded = True
        try:
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump(record, f)
            os.replace(partial, path)
        except OSError as e:  # the record is for `status`; supervising goes on without it
            log.warning("cannot record the children's state in %s: %s", path, e)

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
        path = self._path()
        if path is not None:
            with contextlib.suppress(OSError):
                path.unlink()
