"""One chaos run, start to finish: `up` under faults with live traffic, then the audit.

1. Start `lambda-platform up --no-generate` (wordcount, a fresh data dir under ``work_dir``, a
   free port, an API key, any ``up_env``; ``platform_tree``) and wait until it is ready; run the
   ``before_traffic`` steps, if any. The master's events at that point (the sample events `up`
   loads, and whatever those steps wrote) are the baseline.
2. Writers post events under Idempotency-Keys and retry each until acknowledged; a reader checks
   every answer as it arrives (``traffic``); the injector kills parts and forces recomputes
   (``faults``) until ``max_faults`` or ``duration``.
3. Writers stop (each finishes its request in flight), the platform settles (``served``), the
   reader stops; then the Delta log, the master table and every served row are audited against
   the oracle (``audit``, ``served``), and `up` is stopped with SIGTERM.

Every process of the run is killed at the end, whatever happened (``UpTree.kill_all`` in a
``finally``). ``run_chaos`` returns a ``ChaosReport``; it raises only when the harness itself
cannot do its job (the platform never became ready, a client thread crashed).
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from deltalake import DeltaTable

from tests import oracle
from tests.chaos import audit, report, served
from tests.chaos.faults import FaultInjector, FaultPlan
from tests.chaos.ledger import Ledger
from tests.chaos.platform_tree import UpConfig, UpTree
from tests.chaos.report import ChaosReport, Findings
from tests.chaos.traffic import TRACKED, Reader, Writer, client
from tests.support import free_port


class HarnessError(RuntimeError):
    """The harness could not run the experiment (not a finding about the platform)."""


@dataclass(frozen=True)
class ChaosConfig:
    """A chaos run. Rates are events per second over all writers; times are seconds."""

    work_dir: Path
    plan: FaultPlan = field(default_factory=FaultPlan)
    rate: float = 40.0
    writers: int = 2
    max_batch: int = 20
    give_up_seconds: float = 600.0
    ready_timeout: float = 600.0
    settle_timeout: float = 600.0
    batch_schedule: str = "1h"
    line_separators: bool = False
    reader_interval: float = 0.25
    #: More settings for `up` (``LAMBDA_*`` name to value), e.g. the README's Kafka section's.
    up_env: Mapping[str, str] = field(default_factory=dict)
    #: Steps run once `up` is ready, before the baseline and the traffic (what they write is baseline).
    before_traffic: Callable[[httpx.Client, UpTree], None] | None = None


def run_chaos(config: ChaosConfig, progress: Callable[[str], None] = lambda _: None) -> ChaosReport:
    """Run ``config`` and return its report (see the module docstring); ``progress`` gets a line per step."""
    run = ChaosRun(config, progress)
    try:
        with client(run.tree.base_url, run.tree.config.api_key) as http:
            run.start(http)
            run.inject(http)
            latest = run.settle(http)
            result = run.audit(http, latest)
        run.note("stopping up (SIGTERM)")
        result.stop_seconds = run.tree.stop()
        result.up_exit_code, result.left_running = run.tree.up_exit_code(), run.tree.left_running
        result.seconds = time.monotonic() - run.began
        return result
    finally:
        run.close()


class ChaosRun:
    """The state of one run; ``run_chaos`` calls its steps in order and ``close`` in any case."""

    def __init__(self, config: ChaosConfig, progress: Callable[[str], None]) -> None:
        self.config, self.progress, self.began = config, progress, time.monotonic()
        self.data_dir = config.work_dir / "data"
        self.master = self.data_dir.resolve() / "master" / "wordcount"
        self.tree = UpTree(UpConfig(data_dir=self.data_dir, port=free_port(), api_key=secrets.token_urlsafe(16),
                                    batch_schedule=config.batch_schedule, env=tuple(config.up_env.items())),
                           config.work_dir / "up.log")
        self.findings = Findings()
        self.stop_writers, self.stop_reader = threading.Event(), threading.Event()
        self.writers: list[Writer] = []
        self.reader: Reader | None = None
        self.ledger = Ledger(Counter())
        self.baseline_version = -1
        self.rss_start: dict[str, int] = {}

    def note(self, message: str) -> None:
        self.progress(f"[{time.monotonic() - self.began:7.1f}s] {message}")

    def start(self, http: httpx.Client) -> None:
        """Start `up`, wait until it is ready, take the baseline, start writers and reader."""
        c = self.config
        self.tree.start()
        self.note(f"starting up (data {self.data_dir}, port {self.tree.config.port}, logs {c.work_dir})")
        if not served.wait_settled(http, None, c.ready_timeout, lambda: _check_alive(self.tree)):
            raise HarnessError(f"the platform was not ready within {c.ready_timeout:.0f}s; see {self.tree.log_path}")
        if c.before_traffic is not None:
            self.note("ready; the steps before traffic")
            c.before_traffic(http, self.tree)
        self.baseline_version = DeltaTable(str(self.master)).version()
        events = oracle.read_events(self.master, self.baseline_version)
        self.ledger = Ledger(Counter(w for e in events for w in oracle.words(e["text"])))
        self.rss_start = self.tree.rss_by_role()
        self.note(f"ready; baseline master version {self.baseline_version}; traffic and faults start")
        base, key = self.tree.base_url, self.tree.config.api_key
        self.writers = [Writer(f"w{i}", base, key, self.ledger, self.findings, seed=c.plan.seed * 100 + i,
                               rate=c.rate / c.writers, max_batch=c.max_batch, give_up_seconds=c.give_up_seconds,
                               stop=self.stop_writers, line_separators=c.line_separators)
                        for i in range(c.writers)]
        self.reader = Reader(base, key, self.ledger, self.findings, words=TRACKED, stop=self.stop_reader,
                             interval=c.reader_interval)
        for thread in [*self.writers, self.reader]:
            thread.start()

    def inject(self, http: httpx.Client) -> None:
        self.injector = FaultInjector(self.tree, http, self.ledger, self.findings, self.config.plan, self.note)
        self.injector.run()

    def settle(self, http: httpx.Client) -> int | None:
        """Stop the writers (each finishes its request), wait until answers cover every acknowledgement,
        stop the reader; returns the newest acknowledged version."""
        self.note(f"{self.injector.total} faults done; stopping writers (each finishes its request in flight)")
        self.stop_writers.set()
        _join(self.writers, self.config.give_up_seconds + 120)
        latest = self.ledger.latest_version()
        self.note(f"writers stopped: {self.ledger.acknowledged_events()} events acknowledged, "
                  f"newest version {latest}; settling")
        if not served.wait_settled(http, latest, self.config.settle_timeout, self.injector.ensure_up):
            self.findings.violation(report.NOT_SETTLED,
                                    f"no answer at version {latest} within {self.config.settle_timeout:.0f}s")
        self.stop_reader.set()
        _join([self.reader], 60)
        return latest

    def audit(self, http: httpx.Client, latest: int | None) -> ChaosReport:
        self.note("auditing the Delta log, the master table and every served row")
        assert self.reader is not None
        log = audit.audit_log(self.master, self.ledger, self.baseline_version, self.findings)
        audit.check_stated_versions(log.words_by_version, self.reader.samples, self.findings)
        views = audit.audit_master(self.master, log.committed, self.baseline_version, self.findings)
        rows = served.compare_served(http, views, latest, self.findings, self.config.settle_timeout)
        rss_end = self.tree.rss_by_role()
        return ChaosReport(
            findings=self.findings, faults=self.injector.faults, seconds=0.0,
            acknowledged_requests=len(self.ledger.acknowledged()), acknowledged_events=self.ledger.acknowledged_events(),
            master_events=log.events_after_baseline, keys_in_log=log.keys_in_log, rows_compared=rows,
            recoveries=dict(self.injector.recoveries),
            recovered_means="fresh answers" if self.config.plan.wait_fresh else "ready",
            speed_stages=report.speed_start_stages(self.data_dir / "logs" / "speed.log"),
            rss_mb={role: (self.rss_start.get(role, 0) / 2**20, rss_end.get(role, 0) / 2**20)
                    for role in sorted(self.rss_start.keys() | rss_end.keys())},
            batch_runs=_batch_runs(http), log_dir=str(self.config.work_dir),
        )

    def close(self) -> None:
        """Stop the client threads and kill every process of the run (whatever state it is in)."""
        self.stop_writers.set()
        self.stop_reader.set()
        self.tree.kill_all()
        _join([*self.writers, *([self.reader] if self.reader else [])], 5, check=False)


def _check_alive(tree: UpTree) -> None:
    code = tree.up_exit_code()
    if code is not None:
        raise HarnessError(f"up exited with status {code} before it was ready; see {tree.log_path}")


def _join(threads: Sequence[Writer | Reader], timeout: float, *, check: bool = True) -> None:
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.1, deadline - time.monotonic()))
        if check and thread.is_alive():
            raise HarnessError(f"{thread.name} did not stop within {timeout:.0f}s")
        if check and thread.error is not None:
            raise HarnessError(f"{thread.name} crashed: {thread.error!r}") from thread.error


def _batch_runs(http: httpx.Client) -> Counter[str]:
    """Batch runs by outcome ('interrupted' for runs whose scheduler died), from GET /v1/batch/runs."""
    try:
        runs = http.get("/v1/batch/runs", params={"limit": 500}).json()["runs"]
    except Exception:
        return Counter({"unknown (list failed)": 1})
    return Counter("interrupted" if (r.get("error") or "").startswith("interrupted") else r["status"] for r in runs)
