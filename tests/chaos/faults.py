"""The fault injector: kill -9 a part of the platform (or all of it), or force a recompute, at random.

Kinds (``FAULT_KINDS``): ``speed``, ``api``, ``scheduler``, ``redis`` (SIGKILL of that supervised
child's process group, so its JVM and Python workers die with it; the supervisor restarts it),
``up`` (SIGKILL of every process of the run, then `up` is started again on the same data dir),
and ``recompute`` (POST /v1/batch/runs with ``force``; on a 409 the run in the way is waited for
and the request made once more).

Faults come ``min_gap``..``max_gap`` seconds of traffic apart. The first ones go through every
kind once (seeded shuffle; a kind that could not be injected is tried again, up to 3 times),
then kinds are drawn at random. After a kill the injector waits
until the part is back and answers are fresh again (readyz 200 and a key answer at a version at
least the newest acknowledged when the fault hit; with ``wait_fresh=False`` readyz alone) and
records how long that took; a part not
back within ``recovery_timeout`` is an incident, and injection goes on. If `up` itself exits on
its own at any time, that is an incident: its leftovers are killed and it is started again.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from tests.chaos import report
from tests.chaos.ledger import Ledger
from tests.chaos.platform_tree import CHILD_ROLES, UpTree
from tests.chaos.report import Findings

FAULT_KINDS = ("speed", "api", "scheduler", "redis", "up", "recompute")
#: The key answer polled to tell whether answers are fresh again.
PROBE_WORD = "the"


@dataclass(frozen=True)
class FaultPlan:
    """How many faults, for how long, how far apart; None means no limit of that kind."""

    max_faults: int | None = 10
    duration: float | None = None
    kinds: tuple[str, ...] = FAULT_KINDS
    min_gap: float = 5.0
    max_gap: float = 15.0
    recovery_timeout: float = 300.0
    #: After a kill, wait until answers are fresh again (True) or only until the part is back and
    #: readyz answers 200 (False: quicker, for the bounded test).
    wait_fresh: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        unknown = set(self.kinds) - set(FAULT_KINDS)
        if unknown or not self.kinds:
            raise ValueError(f"fault kinds must be a non-empty subset of {FAULT_KINDS}; got {self.kinds}")
        if self.max_faults is None and self.duration is None:
            raise ValueError("give max_faults or duration (or both): a chaos run must end")


class FaultInjector:
    """Runs the plan against ``tree``; ``faults`` counts what was injected, ``recoveries`` the seconds."""

    def __init__(self, tree: UpTree, http: httpx.Client, ledger: Ledger, findings: Findings, plan: FaultPlan,
                 progress: Callable[[str], None] = lambda _: None) -> None:
        self.tree, self.http, self.ledger, self.findings, self.plan = tree, http, ledger, findings, plan
        self.progress = progress
        self.rng = random.Random(plan.seed)
        self.faults: Counter[str] = Counter()
        self.recoveries: dict[str, list[float]] = defaultdict(list)
        self.abort = threading.Event()

    def run(self) -> None:
        order = list(self.plan.kinds)
        self.rng.shuffle(order)
        began = time.monotonic()

        def done() -> bool:
            total = sum(self.faults.values())
            return (self.abort.is_set() or (self.plan.max_faults is not None and total >= self.plan.max_faults)
                    or (self.plan.duration is not None and time.monotonic() - began >= self.plan.duration))

        skipped: Counter[str] = Counter()
        while not done():
            self.pause(self.rng.uniform(self.plan.min_gap, self.plan.max_gap))
            if done():
                break
            kind = order[0] if order else self.rng.choice(self.plan.kinds)
            injected = self.inject(kind)
            skipped[kind] += not injected
            if order and (injected or skipped[kind] >= 3):  # a kind that cannot be injected 3 times is dropped
                order.remove(kind)

    def pause(self, seconds: float) -> None:
        """Let traffic flow for ``seconds``, restarting `up` if it exits meanwhile."""
        end = time.monotonic() + seconds
        while not self.abort.is_set() and time.monotonic() < end:
            self.ensure_up()
            self.abort.wait(min(0.5, max(0.0, end - time.monotonic())))

    def inject(self, kind: str) -> bool:
        """Inject one fault of ``kind``; False if it could not be (an incident says why)."""
        self.ensure_up()
        fresh_at = self.ledger.latest_version()
        if kind == "recompute":
            if not self._recompute():
                return False
        elif kind == "up":
            killed = self.tree.kill_all()
            self.tree.start()
            self.progress(f"fault {self.total + 1}: killed the whole up tree ({killed} processes), restarted up")
        else:
            pid = self.tree.kill_child(kind)
            if pid is None:
                self.findings.incident(report.FAULT_SKIPPED, f"{kind} was not running")
                return False
            self.progress(f"fault {self.total + 1}: kill -9 {kind} (pid {pid})")
        self.faults[kind] += 1
        if kind != "recompute":
            self._wait_recovered(kind, fresh_at if self.plan.wait_fresh else None)
        return True

    @property
    def total(self) -> int:
        return sum(self.faults.values())

    def ensure_up(self) -> None:
        code = self.tree.up_exit_code()
        if code is None:
            return
        self.findings.incident(report.UP_EXITED, f"exit status {code}; see {self.tree.log_path}")
        self.progress(f"up exited on its own (status {code}); restarting it")
        self.tree.kill_all()
        self.tree.start()

    def _recompute(self) -> bool:
        for _ in range(2):
            try:
                response = self.http.post("/v1/batch/runs", json={"force": True})
            except httpx.TransportError as e:
                self.findings.incident(report.FAULT_SKIPPED, f"recompute: API unreachable ({e})")
                return False
            if response.status_code == 202:
                self.progress(f"fault {self.total + 1}: forced recompute {response.json()['id']}")
                return True
            if response.status_code != 409:
                self.findings.incident(report.FAULT_SKIPPED, f"recompute: {response.status_code} {response.text[:200]}")
                return False
            self.findings.incident(report.RECOMPUTE_BUSY, response.text[:200])
            self._wait_run_done(response.headers.get("Location"))
        return False

    def _wait_run_done(self, location: str | None) -> None:
        deadline = time.monotonic() + self.plan.recovery_timeout
        while location and time.monotonic() < deadline and not self.abort.is_set():
            try:
                if self.http.get(location).json().get("status") not in ("queued", "running"):
                    return
            except (httpx.TransportError, ValueError):
                pass
            self.pause(1.0)

    def _wait_recovered(self, kind: str, fresh_at: int | None) -> None:
        began = time.monotonic()
        while time.monotonic() - began < self.plan.recovery_timeout and not self.abort.is_set():
            self.ensure_up()
            if set(CHILD_ROLES) <= set(self.tree.children()) and self.fresh(fresh_at):
                self.recoveries[kind].append(time.monotonic() - began)
                self.progress(f"{kind} fault: back ({'fresh answers' if fresh_at is not None else 'readyz 200'}) "
                              f"after {self.recoveries[kind][-1]:.1f}s")
                return
            self.abort.wait(0.5)
        self.findings.incident(report.NOT_RECOVERED, f"{kind}: not back within {self.plan.recovery_timeout:.0f}s")

    def fresh(self, version: int | None) -> bool:
        """readyz answers 200 and a key answer states at least ``version`` (None: readyz alone)."""
        try:
            if self.http.get("/readyz").status_code != 200:
                return False
            if version is None:
                return True
            response = self.http.get(f"/v1/views/word_counts/keys/{PROBE_WORD}")
            return response.status_code == 200 and response.json()["version"] >= version
        except (httpx.TransportError, ValueError, KeyError):
            return False
