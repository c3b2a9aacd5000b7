"""Findings of a chaos run (violations of a promise, incidents, counters) and its summary table."""

from __future__ import annotations

import re
import statistics
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Examples kept per kind of violation or incident.
EXAMPLES = 5

#: Violations: each one breaks a documented promise of the platform.
ABOVE_ACKNOWLEDGED = "answer above what was sent (double count)"
VERSION_BACKWARDS = "version went backwards for a key"
VALUE_BACKWARDS = "value went backwards for a key"
NOT_EXACT_PARTIAL = "answer above the exact count at its stated version, equal to none (partly applied)"
NOT_EXACT_STALE_LABEL = "answer above the exact count at its stated version, exact at a later one (label too old)"
NOT_EXACT_BELOW = "answer below the exact count at its stated version"
NEVER_ACKNOWLEDGED = "request never acknowledged (writer gave up)"
REJECTED = "request rejected (4xx)"
KEY_LOST = "acknowledged key in no commit (lost)"
KEY_DUPLICATED = "key in more than one commit (duplicate)"
RECEIPT_VERSION = "202 version differs from the key's commit"
COMMIT_CONTENT = "commit's events differ from its requests"
UNKNOWN_EVENTS = "events in the master that nobody sent"
MASTER_DIFFERS = "master rows differ from sent events (oracle)"
SERVED_DIFFERS = "served answer differs from the master oracle"
TOP_DIFFERS = "top-N differs from the master oracle"
NOT_SETTLED = "platform did not settle"

#: Incidents: worth reporting, not a broken promise by themselves.
UP_EXITED = "up exited on its own (restarted by the harness)"
FAULT_SKIPPED = "fault skipped: target not running"
RECOMPUTE_BUSY = "forced recompute refused: a run is queued or running (409)"
NOT_RECOVERED = "part not back within the recovery wait"


@dataclass
class Findings:
    """Thread-safe counts with a few examples each, and plain counters."""

    violations: Counter[str] = field(default_factory=Counter)
    incidents: Counter[str] = field(default_factory=Counter)
    counters: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)
    maxima: dict[str, float] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def violation(self, kind: str, detail: str, n: int = 1) -> None:
        self._note(self.violations, kind, detail, n)

    def incident(self, kind: str, detail: str) -> None:
        self._note(self.incidents, kind, detail, 1)

    def count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.counters[name] += n

    def maximum(self, name: str, value: float) -> None:
        """Keep the largest ``value`` seen under ``name`` (e.g. the largest excess of an answer)."""
        with self._lock:
            self.maxima[name] = max(value, self.maxima.get(name, value))

    def _note(self, counter: Counter[str], kind: str, detail: str, n: int) -> None:
        with self._lock:
            counter[kind] += n
            kept = self.examples.setdefault(kind, [])
            if len(kept) < EXAMPLES and detail not in kept:
                kept.append(detail)


@dataclass
class ChaosReport:
    """Everything a run measured; ``table()`` is the summary printed by benchmarks/chaos.py."""

    findings: Findings
    faults: Counter[str]
    seconds: float
    acknowledged_requests: int = 0
    acknowledged_events: int = 0
    master_events: int = 0
    keys_in_log: int = 0
    rows_compared: int = 0
    recoveries: dict[str, list[float]] = field(default_factory=dict)
    #: What "back" means in ``recoveries``: "fresh answers" or "ready".
    recovered_means: str = "fresh answers"
    #: Seconds from each start of a speed-layer process to each of its start-up stages (``speed_start_stages``).
    speed_stages: dict[str, list[float]] = field(default_factory=dict)
    rss_mb: dict[str, tuple[float, float]] = field(default_factory=dict)
    batch_runs: Counter[str] = field(default_factory=Counter)
    stop_seconds: float | None = None
    #: `up`'s exit status after the final SIGTERM (0: it stopped everything cleanly).
    up_exit_code: int | None = None
    #: What was still running once `up` had exited on that SIGTERM ("pid command"; killed by the harness after).
    left_running: list[str] = field(default_factory=list)
    log_dir: str = ""

    @property
    def fault_total(self) -> int:
        return sum(self.faults.values())

    def table(self) -> str:
        f = self.findings
        rows: list[tuple[str, Any]] = [("duration (s)", f"{self.seconds:.0f}"), ("faults", self.fault_total)]
        rows += [(f"  {kind}", n) for kind, n in sorted(self.faults.items())]
        rows += [
            ("acknowledged requests (Idempotency-Keys)", self.acknowledged_requests),
            ("acknowledged events", self.acknowledged_events),
            ("write attempts (incl. retries)", f.counters["write attempts"]),
            ("replayed acknowledgements", f.counters["replayed"]),
            ("master events after the baseline", self.master_events),
            ("keys found in the Delta log", self.keys_in_log),
            ("answers checked live (key + top entries)", f.counters["answers checked"]),
            ("answers 503 / unreachable", f"{f.counters['answers 503']} / {f.counters['answers unreachable']}"),
            ("answers checked at stated version", f.counters["answers checked at version"]),
            ("view rows compared at the end", self.rows_compared),
        ]
        rows += [(f"batch runs {status}", n) for status, n in sorted(self.batch_runs.items())]
        for part, times in sorted(self.recoveries.items()):
            if times:
                rows.append((f"{self.recovered_means} after {part} fault (s): median / max (n)",
                             f"{statistics.median(times):.0f} / {max(times):.0f} ({len(times)})"))
        for stage, times in self.speed_stages.items():
            if times:
                rows.append((f"speed start, {stage} (s): median / max (n)",
                             f"{statistics.median(times):.1f} / {max(times):.1f} ({len(times)})"))
        for part, (start, end) in sorted(self.rss_mb.items()):
            rows.append((f"RSS {part} (MB): start -> end", f"{start:.0f} -> {end:.0f}"))
        if self.stop_seconds is not None:
            rows.append(("graceful stop of up (s)", f"{self.stop_seconds:.0f}"))
            rows.append(("up's exit status; processes it left running", f"{self.up_exit_code}; {len(self.left_running)}"))
        rows += [(name, f"{value:g}") for name, value in sorted(f.maxima.items())]
        rows.append(("VIOLATIONS", sum(f.violations.values())))
        rows += [(f"  {kind}", n) for kind, n in sorted(f.violations.items())]
        rows += [(f"incident: {kind}", n) for kind, n in sorted(f.incidents.items())]
        width = max(len(r[0]) for r in rows)
        lines = [f"{name:<{width}}  {value}" for name, value in rows]
        for kind in [*sorted(f.violations), *sorted(f.incidents)]:
            lines += [f"e.g. {kind}: {ex}" for ex in f.examples.get(kind, [])]
        if self.log_dir:
            lines.append(f"logs: {self.log_dir}")
        return "\n".join(lines)


#: The speed layer's start-up stages as its log tells them (``speed_layer.runner``, ``speed_layer.job``): the
#: seconds each line states, from the start of the process unless the stage's name says otherwise.
_SPEED_STAGES = {
    "session ready": re.compile(r"speed layer of \S+: Spark session ready, ([\d.]+)s after the process started"),
    "query started": re.compile(r"speed layer of \S+: query started, ([\d.]+)s after the process started"),
    "warm-up (its own time)": re.compile(r"speed layer of \S+: warmed up in ([\d.]+)s"),
    "first micro-batch done": re.compile(r"speed layer of \S+: first micro-batch .* ([\d.]+)s after the process started"),
    "first micro-batch, after the query started": re.compile(
        r"speed layer of \S+: first micro-batch .* done ([\d.]+)s after the query started"),
    "caught up with the master": re.compile(r"speed layer of \S+: caught up .* ([\d.]+)s after the process started"),
}


def speed_start_stages(log: Path) -> dict[str, list[float]]:
    """Per start-up stage of the speed layer, the seconds each start took to reach it, from its log (``speed.log``);
    stages its log does not tell (code before these lines) are left out."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return {}
    found = {stage: [float(m) for m in pattern.findall(text)] for stage, pattern in _SPEED_STAGES.items()}
    return {stage: times for stage, times in found.items() if times}
