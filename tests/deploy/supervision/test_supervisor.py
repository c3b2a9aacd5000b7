"""The supervisor restarts a child that dies, with growing backoff, and stops children together, stop_last ones last."""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from pathlib import Path

import pytest

import deploy.supervision.supervisor as supervisor_module
from deploy.supervision.supervisor import Child, Supervisor


def _child(name: str, code: str, tmp_path: Path) -> Child:
    return Child(name, [sys.executable, "-c", code], dict(os.environ), tmp_path / f"{name}.log")


def test_a_dying_child_is_restarted_with_backoff_and_all_stop(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="deploy.supervision.supervisor")
    starts = tmp_path / "starts"
    crasher = _child("crasher", f"open({str(starts)!r}, 'a').write('x'); raise SystemExit(3)", tmp_path)
    steady = _child("steady", "import time; time.sleep(600)", tmp_path)
    supervisor = Supervisor([steady, crasher])
    supervisor.start()
    try:
        deadline = time.monotonic() + 20
        while len(starts.read_text() if starts.exists() else "") < 3 and time.monotonic() < deadline:
            supervisor.watch_once()
            time.sleep(0.05)
        assert len(starts.read_text()) >= 3, "the crashing child was not restarted"
        assert crasher.restarts >= 2
        assert steady.running and steady.restarts == 0
    finally:
        supervisor.stop(grace=5)
    assert not steady.running and steady.process.returncode == -15
    assert "crasher ended (exit 3)" in caplog.text and "stopped steady (ended by SIGTERM)" in caplog.text


_SLOW_TO_STOP = """
import signal, sys, time
def term(*_):
    open({log!r}, 'a').write(f'{name} term {{time.time()}}\\n')
    time.sleep(3.0)  # finishing its work (long enough for the others to be signalled meanwhile)
    open({log!r}, 'a').write(f'{name} exit {{time.time()}}\\n')
    sys.exit(0)
signal.signal(signal.SIGTERM, term)
open({log!r}, 'a').write('{name} up\\n')
time.sleep(600)
"""


@pytest.mark.slow  # over 4 s: the full tier (the quick tier has a 3-minute budget)
def test_children_stop_together_and_stop_last_ones_after_them(tmp_path: Path) -> None:
    log = tmp_path / "events"
    store = Child("store", [sys.executable, "-c", _SLOW_TO_STOP.format(log=str(log), name="store")],
                  dict(os.environ), tmp_path / "store.log", stop_last=True)
    workers = [_child(name, _SLOW_TO_STOP.format(log=str(log), name=name), tmp_path) for name in ("a", "b", "c")]
    supervisor = Supervisor([store, *workers])
    supervisor.start()
    deadline = time.monotonic() + 20
    while (log.read_text().count(" up") if log.exists() else 0) < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    supervisor.stop(grace=20)
    events = {(name, what): float(at) for name, what, at in (line.split() for line in log.read_text().splitlines()
                                                            if not line.endswith(" up"))}
    first_exit = min(events[(name, "exit")] for name in ("a", "b", "c"))
    assert all(events[(name, "term")] < first_exit for name in ("a", "b", "c")), "workers were stopped one by one"
    assert events[("store", "term")] > max(events[(name, "exit")] for name in ("a", "b", "c")), \
        "the stop_last child was stopped before the others had exited"
    assert all(c.process.returncode == 0 for c in (store, *workers))


def test_children_are_recorded_with_failures_and_last_error_and_a_code_change_is_no_failure(tmp_path: Path) -> None:
    from deploy.supervision.code_watch import EXIT_CODE_CHANGED
    from deploy.supervision.supervisor import read_children

    # The command line's report, wrapped by the console's width, is the error recorded.
    crasher = _child("crasher", "print('working'); print('error: RuntimeError: the speed layer\\'s query failed:'); "
                                "print('ValueError: poison event', flush=True); raise SystemExit(1)", tmp_path)
    changed = _child("changed", f"raise SystemExit({EXIT_CODE_CHANGED})", tmp_path)
    steady = _child("steady", "import time; time.sleep(600)", tmp_path)
    supervisor = Supervisor([steady, crasher, changed])
    supervisor.start()
    try:
        deadline = time.monotonic() + 30
        while (crasher.failures < 2 or changed.total_restarts < 1) and time.monotonic() < deadline:
            supervisor.watch_once()
            time.sleep(0.05)
        recorded = read_children(tmp_path)
        assert recorded is not None, "no record beside the logs"
        assert recorded["crasher"].failing() and recorded["crasher"].failures >= 2, recorded["crasher"]
        assert recorded["crasher"].last_exit == "exit 1"
        assert recorded["crasher"].last_error == ("error: RuntimeError: the speed layer's query failed: "
                                                  "ValueError: poison event")
        assert not recorded["changed"].failing() and recorded["changed"].last_exit == f"exit {EXIT_CODE_CHANGED}"
        assert not recorded["steady"].failing() and recorded["steady"].running
        assert oct((tmp_path / "children.json").stat().st_mode & 0o777) == "0o600"
    finally:
        supervisor.stop(grace=5)
    assert read_children(tmp_path) is None and not (tmp_path / "children.json").exists()


@pytest.mark.slow  # over 2.5 s in a full run: the full tier (the quick tier has a 3-minute budget)
def test_a_child_killed_from_outside_restarts_without_growing_backoff(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGKILL from outside (an operator, the OOM killer, a chaos test) is no crash loop: the backoff starts over."""
    monkeypatch.setattr(supervisor_module, "_KILLED_AFTER", 0.2)  # up longer than this when killed
    child = _child("killed", "import time; time.sleep(600)", tmp_path)
    supervisor = Supervisor([child])
    supervisor.start()
    try:
        for kill in range(4):
            deadline = time.monotonic() + 30
            while not (child.running and child.total_restarts == kill) and time.monotonic() < deadline:
                supervisor.watch_once()
                time.sleep(0.05)
            time.sleep(0.3)
            assert child.process is not None and child.running, f"not restarted after kill {kill}"
            os.kill(child.process.pid, signal.SIGKILL)
            child.process.wait(10)
        while not child.running and time.monotonic() < deadline:
            supervisor.watch_once()
            time.sleep(0.05)
        assert child.total_restarts == 4 and child.restarts == 1, "each kill: one restart, the backoff reset"
        assert child.failures == 4, "killed ones still count as failures for status"
    finally:
        supervisor.stop(grace=5)
