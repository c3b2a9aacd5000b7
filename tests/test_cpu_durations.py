"""``--cpu-durations`` counts a test's CPU where it is spent: in the processes it starts, ended or running."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.support import wait_for
from tests.support.cpu_durations import tree_cpu_seconds

#: Spends half a second of its own CPU (process time, whatever the machine's load), then does what follows.
_BURN = "import time\nend = time.process_time() + 0.5\nwhile time.process_time() < end:\n    pass\n"


def _cpu_of(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_the_cpu_of_ended_grandchildren_and_of_running_children_is_counted_once() -> None:
    before = tree_cpu_seconds(os.getpid())
    # A child whose own child burns, then both end: counted through the times of reaped children.
    grandchild = f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', {_BURN!r}], check=True)\n"
    subprocess.run([sys.executable, "-c", grandchild], check=True)
    # A child that burns and is still running: counted from /proc.
    running = subprocess.Popen([sys.executable, "-c", _BURN + "import sys\nsys.stdin.read()\n"], stdin=subprocess.PIPE)
    try:
        wait_for(lambda: _cpu_of(running.pid) >= 0.5, "the running child to burn its half second", 60)
        spent = tree_cpu_seconds(os.getpid()) - before
    finally:
        running.communicate(b"", timeout=30)
    # Two half seconds burnt, plus three interpreters' start and this process's polling; not twice anything.
    assert 1.0 <= spent < 2.5, spent
