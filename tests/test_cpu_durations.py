"""``--cpu-durations`` counts a test's CPU where it is spent: in the processes it starts, ended or running."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support import wait_for
from tests.support.cpu_durations import tree_cpu_seconds

#: Spends half a second of its own CPU (process time, whatever the machine's load); with "wait", then waits.
BURN = """import sys, time
end = time.process_time() + 0.5
while time.process_time() < end:
    pass
if sys.argv[1:] == ["wait"]:
    sys.stdin.read()
"""
#: Runs a burn to its end: the burn is its child, so the parent below is its grandparent.
MIDDLE = "import subprocess, sys\nsubprocess.run([sys.executable, sys.argv[1]], check=True)\n"
#: Runs MIDDLE (ended and reaped), then a burn that keeps running; prints that one's pid and waits.
PARENT = """import subprocess, sys
burn, middle = sys.argv[1:]
subprocess.run([sys.executable, middle, burn], check=True)
running = subprocess.Popen([sys.executable, burn, "wait"], stdin=subprocess.PIPE)
print(running.pid, flush=True)
sys.stdin.read()
running.communicate(b"")
"""


def _cpu_of(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_the_cpu_of_ended_grandchildren_and_of_running_children_is_counted_once(tmp_path: Path) -> None:
    """On a process tree of its own (this worker's JVMs keep working meanwhile): a grandchild that burnt half a
    second and ended, and a child burning half a second and still running: one second, each half counted once."""
    scripts = {}
    for name, text in (("burn", BURN), ("middle", MIDDLE), ("parent", PARENT)):
        scripts[name] = tmp_path / f"{name}.py"
        scripts[name].write_text(text)
    parent = subprocess.Popen([sys.executable, scripts["parent"], scripts["burn"], scripts["middle"]],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert parent.stdout is not None
        running = int(parent.stdout.readline())
        wait_for(lambda: _cpu_of(running) >= 0.5, "the running child to burn its half second", 60)
        spent = tree_cpu_seconds(parent.pid)
    finally:
        parent.communicate(b"", timeout=30)
    # Two half seconds, and four interpreters' start-up; either half counted twice would make it 1.5 s or more.
    assert 1.0 <= spent < 1.45, spent
