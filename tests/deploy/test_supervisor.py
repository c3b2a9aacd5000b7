"""The supervisor restarts a child that dies, with growing backoff, and stops children in reverse order."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from deploy.supervisor import Child, Supervisor


def _child(name: str, code: str, tmp_path: Path) -> Child:
    return Child(name, [sys.executable, "-c", code], dict(os.environ), tmp_path / f"{name}.log")


def test_a_dying_child_is_restarted_with_backoff_and_all_stop(tmp_path: Path) -> None:
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
