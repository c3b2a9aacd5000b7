"""``--cpu-durations=N``: the N tests that cost the run the most CPU, beside their wall time.

When every core is busy (the suite's two workers on two cores), much of a test's wall time is other
tests' work, and a test that mostly waits looks as costly as one that computes. Its CPU seconds are what
it takes from the run. A test's CPU here is its worker process's and every descendant's: the JVMs,
commands and servers it starts, the ones still running (read from /proc) and the ended ones their parents
reaped (counted in the parents' children's times); also what the worker's session-scoped processes (its
SparkSession's JVM, the Kafka broker) do meanwhile. Processes orphaned by a kill -9 of their parent are missed,
so a test that kills a whole process tree (the chaos test, a kill of `up`) reads low: the machine's own
accounting (a cgroup around the run) is the check. Linux only (/proc); elsewhere the table says so.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

_PROC = Path("/proc")
_PROPERTY = "cpu_seconds"
_START = pytest.StashKey[float]()


def tree_cpu_seconds(root: int) -> float:
    """CPU seconds of process ``root`` and all its descendants, ended ones once their parents reaped them."""
    ticks = os.sysconf("SC_CLK_TCK")
    children: dict[int, list[tuple[int, float]]] = {}
    own = 0.0
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # ended meanwhile
        fields = stat[stat.rindex(")") + 2:].split()  # after the command name, which may hold spaces
        seconds = sum(int(t) for t in fields[11:15]) / ticks  # utime, stime, cutime, cstime
        if int(entry.name) == root:
            own = seconds
        else:
            children.setdefault(int(fields[1]), []).append((int(entry.name), seconds))
    total, stack = own, [root]
    while stack:
        for pid, seconds in children.get(stack.pop(), ()):
            total += seconds
            stack.append(pid)
    return total


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("terminal reporting").addoption(
        "--cpu-durations", type=int, default=0, metavar="N",
        help="show the N tests that used the most CPU (their own process's and every process they started); "
             "0: none")


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("cpu_durations"):
        config.pluginmanager.register(_Table(config.getoption("cpu_durations")), "cpu-durations-table")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, Any, None]:
    if item.config.getoption("cpu_durations") and _PROC.is_dir():
        item.stash[_START] = tree_cpu_seconds(os.getpid())
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    outcome = yield
    if call.when == "teardown" and _START in item.stash:  # the report travels to xdist's controller with it
        spent = tree_cpu_seconds(os.getpid()) - item.stash[_START]
        outcome.get_result().user_properties.append((_PROPERTY, round(spent, 2)))


class _Table:
    """Collects every test's CPU and wall time from its reports (a worker's, under xdist) and prints the top."""

    def __init__(self, rows: int) -> None:
        self.rows = rows
        self.cpu: dict[str, float] = {}
        self.wall: Counter[str] = Counter()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.wall[report.nodeid] += report.duration
        for name, value in report.user_properties:
            if name == _PROPERTY:
                self.cpu[report.nodeid] = float(value)

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        terminalreporter.write_sep("=", f"{self.rows} tests using the most CPU (theirs and their processes')")
        if not self.cpu:
            terminalreporter.write_line("no CPU measured (it needs Linux's /proc)")
            return
        terminalreporter.write_line(f"{'CPU s':>8} {'wall s':>8}  test")
        for nodeid, cpu in sorted(self.cpu.items(), key=lambda kv: -kv[1])[:self.rows]:
            terminalreporter.write_line(f"{cpu:8.1f} {self.wall[nodeid]:8.1f}  {nodeid}")
        terminalreporter.write_line(f"all {len(self.cpu)} tests: {sum(self.cpu.values()):.0f} CPU s, "
                                    f"{sum(self.wall[n] for n in self.cpu):.0f} s of wall time")
