"""Bounded chaos (slow tier): `up` under one fault of each kind with live traffic loses nothing and counts nothing twice.

Every kind of fault happens once, in a seeded order (kill -9 of the speed layer, the API, the scheduler,
Redis and the whole `up` tree; a forced recompute); faults drawn at random after those are the
benchmark's. The oracle is independent of the platform: the writers' own record of what was
acknowledged, the master's Delta log and table read with delta-rs (tests/chaos/audit.py), and
plain Python views (tests/oracle.py). The full run, >= 50 faults with a summary table:
benchmarks/chaos.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos.faults import FAULT_KINDS, FaultPlan
from tests.chaos.harness import ChaosConfig, run_chaos

pytestmark = [pytest.mark.slow, pytest.mark.uses_platform, pytest.mark.chaos]


def test_chaos_bounded(tmp_path: Path) -> None:
    plan = FaultPlan(max_faults=len(FAULT_KINDS), min_gap=2.0, max_gap=4.0, wait_fresh=False, seed=7)
    result = run_chaos(ChaosConfig(work_dir=tmp_path, plan=plan, rate=15.0, max_batch=30), progress=print)
    print(result.table())

    assert set(result.faults) == set(FAULT_KINDS), f"every kind of fault happens: {dict(result.faults)}"
    assert result.fault_total == len(FAULT_KINDS)
    assert result.acknowledged_events > 0 and result.findings.counters["answers checked"] > 0
    assert result.rows_compared > 0 and result.keys_in_log >= result.acknowledged_requests
    assert not result.findings.violations, result.table()
