"""A batch generation published from real events, and the oracle's view of it; comparing an answer with it."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batch_layer.recompute.job import run_batch
from deploy.settings import Settings
from shared_logic.registry import load_pipeline
from tests import oracle
from tests.support import ingest_file


@dataclass(frozen=True)
class Published:
    """A batch run's result as the oracle sees it."""

    settings: Settings
    generation: int
    groups: dict[str, oracle.Groups]
    views: dict[str, oracle.ViewTable]


def publish(spark: Any, settings: Settings, events: list[dict[str, Any]], tmp_path: Path, redis_url: str) -> Published:
    """Ingest ``events``, run the batch, and compute the oracle at the barrier's master version."""
    ingest_file(settings, events, tmp_path / f"{settings.pipeline}.jsonl")
    result = run_batch(spark, settings, load_pipeline(settings.pipeline), redis_url=redis_url)
    barrier = oracle.barrier_versions(settings.master_path)[-1]
    assert result.generation == barrier
    master_events = oracle.read_events(settings.master_path, barrier)
    return Published(settings, barrier, oracle.groups(settings.pipeline, master_events),
                     oracle.views(settings.pipeline, master_events))


def value_problems(where: str, got: dict[str, Any], want: dict[str, Any]) -> list[str]:
    """Differences between an answer's value and the oracle's measures (HyperLogLog tolerance for distinct)."""
    if set(got) != set(want):
        return [f"{where}: fields {sorted(got)} != {sorted(want)}"]
    problems = []
    for name, expected in want.items():
        value = got[name]
        if name.startswith("distinct_"):
            ok = isinstance(value, int) and abs(value - expected) <= max(1, 0.03 * expected)
        elif name.startswith(("sum_", "avg_")):
            ok = isinstance(value, (int, float)) and math.isclose(value, expected, rel_tol=1e-9)
        else:
            ok = value == expected and type(value) is type(expected)
        if not ok:
            problems.append(f"{where}: {name} = {value!r}, oracle {expected!r}")
    return problems
