"""Every benchmark's quick variant, one after the other, and ONE table: measure, target, figure, met, commit.

    .venv/bin/python benchmarks/suite.py                   # quick variants (what `make bench` runs)
    .venv/bin/python benchmarks/suite.py --write-results   # ... and append the dated table to RESULTS.md
    .venv/bin/python benchmarks/suite.py --only query batch
    .venv/bin/python benchmarks/suite.py --full            # the issue's sizes (1M and 10M events, 10M rows): hours

Each benchmark runs as its own child process with ``--json FILE`` and the suite reads the figures
from that file (the targets and how each is read live in ``_suite_measures.py``). The quick
variants cut rounds and sizes, not what is measured: the batch recompute still runs 1M events,
the speed layer 200k events; figures from a quick run are noisier than the full ones (one timed
round, not the median of two or three). A benchmark that fails or times out shows as such in the
table (its log is kept and named). Measures no quick variant covers (the 10M batch, 10M rows) or
no benchmark exists for yet (Redis Cluster) show as "not measured" with the command that would.
Run it on a quiet machine: the benchmarks print how many cores other processes used.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import ROOT, git_commit
from _suite_measures import BENCHES, MEASURES, Bench, Figures, Measure, Outcome

RESULTS = ROOT / "benchmarks" / "RESULTS.md"


@dataclass
class BenchRun:
    bench: Bench
    seconds: float
    figures: Figures | None
    error: str = ""
    load: float = 0.0  # the machine's 1-minute load average when the run ended


def run_bench(bench: Bench, full: bool, out_dir: Path) -> BenchRun:
    """Run one benchmark as a child process; its figures from its ``--json`` file, or why there are none."""
    out, log = out_dir / f"{bench.name}.json", out_dir / f"{bench.name}.log"
    argv = [sys.executable, *bench.argv(full), "--json", str(out)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    started = time.perf_counter()
    try:
        with log.open("w") as sink:
            rc = subprocess.run(argv, cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT,
                                timeout=bench.timeout * (20 if full else 1)).returncode
    except subprocess.TimeoutExpired:
        return BenchRun(bench, time.perf_counter() - started, None, f"timed out; log {log}", os.getloadavg()[0])
    seconds, load = time.perf_counter() - started, os.getloadavg()[0]
    if not out.exists():
        return BenchRun(bench, seconds, None, f"exit {rc}, no figures; log {log}", load)
    figures = json.loads(out.read_text())["figures"]
    return BenchRun(bench, seconds, figures, "" if rc == 0 else f"exit {rc} (figures kept); log {log}", load)


def outcome(measure: Measure, runs: dict[str, BenchRun]) -> Outcome:
    """The row of ``measure`` from this run's figures."""
    if measure.bench is None or measure.read is None:
        return Outcome("not measured", None, measure.command)
    run = runs[measure.bench]
    if run.figures is None:
        return Outcome("failed", False, run.error)
    try:
        result = measure.read(run.figures)
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as e:
        return Outcome("failed", False, f"figures unreadable ({e!r}); {run.error}")
    if result is None:
        return Outcome("not measured", None, measure.command)
    return result if not run.error else Outcome(result.figure, result.met, "; ".join(filter(None, [result.note, run.error])))


def verdict(o: Outcome) -> str:
    if o.figure == "not measured":
        return "not measured"
    if o.figure == "failed":
        return o.figure
    return "met" if o.met else "NOT met" if o.met is False else "(indicative)"


def rows(runs: dict[str, BenchRun]) -> list[tuple[str, str, str, str, str]]:
    """(measure, target, figure, met, note) per measure of the benchmarks run (and those with no benchmark)."""
    table = []
    for m in MEASURES:
        if m.bench is not None and m.bench not in runs:
            continue  # left out with --only
        o = outcome(m, runs)
        table.append((m.measure, m.target, o.figure, verdict(o), o.note))
    return table


def print_table(table: list[tuple[str, str, str, str, str]], commit: str, when: str, profile: str) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"benchmarks ({profile}) at commit {commit}, {when}", show_lines=False)
    for name in ("measure", "target", "figure", "met", "commit"):
        t.add_column(name, overflow="fold")
    styles = {"met": "green", "NOT met": "red", "failed": "red"}
    for measure, target, figure, met, note in table:
        shown = figure + (f"\n[dim]{note}[/dim]" if note else "")
        t.add_row(measure, target, shown, f"[{styles.get(met, 'yellow')}]{met}[/]", commit)
    Console(width=int(os.environ.get("COLUMNS", 160))).print(t)


def markdown(table: list[tuple[str, str, str, str, str]], commit: str, when: str, profile: str,
             runs: dict[str, BenchRun], total: float) -> str:
    """The dated table for RESULTS.md."""
    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    lines = [f"## {when}, commit {commit} (`suite.py`{' --full' if profile == 'full' else ''}, {total / 60:.1f} min)", "",
             "| measure | target | figure | met | commit |", "|---|---|---|---|---|"]
    for measure, target, figure, met, note in table:
        lines.append(f"| {cell(measure)} | {cell(target)} | {cell(figure + (f' ({note})' if note else ''))} | "
                     f"{met} | {commit} |")
    lines += ["", f"Benchmarks run ({os.cpu_count()} cores; seconds, and the 1-minute load average as each ended): "
              + ", ".join(f"{r.bench.name} {r.seconds:.0f} s (load {r.load:.1f}" + (f"; {r.error})" if r.error else ")")
                          for r in runs.values()), ""]
    return "\n".join(lines)


def write_results(text: str) -> None:
    header = ("# Benchmark results\n\nOne dated table per run of `benchmarks/suite.py --write-results` (`make bench` "
              "runs the quick variants), newest last. Each figure is from that run on the machine it ran on; "
              "see benchmarks/README.md for what each benchmark measures.\n\n")
    existing = RESULTS.read_text() if RESULTS.exists() else header
    RESULTS.write_text(existing.rstrip("\n") + "\n\n" + text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--full", action="store_true", help="the issue's sizes instead of the quick variants (hours)")
    parser.add_argument("--only", nargs="+", choices=[b.name for b in BENCHES], help="run only these benchmarks")
    parser.add_argument("--write-results", action="store_true", help=f"append the dated table to {RESULTS.name}")
    parser.add_argument("--keep", type=Path, default=None, help="keep each benchmark's log and JSON here")
    args = parser.parse_args(argv)
    head, changed = git_commit("serving", "batch_layer", "speed_layer", "deploy", "shared_logic")
    commit = head + ("+dirty" if changed else "")
    profile = "full" if args.full else "quick"
    selected = [b for b in BENCHES if not args.only or b.name in args.only]
    started = time.perf_counter()
    runs: dict[str, BenchRun] = {}
    out_dir = args.keep or Path(tempfile.mkdtemp(prefix="bench-suite-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    print(f"benchmark suite ({profile}) at commit {commit}: {', '.join(b.name for b in selected)}; "
          f"{os.cpu_count()} cores; logs in {out_dir}", flush=True)
    for bench in selected:
        print(f"  {bench.name:<11} python {' '.join(bench.argv(args.full))} ...", end=" ", flush=True)
        run = runs[bench.name] = run_bench(bench, args.full, out_dir)
        print(f"{run.seconds:.0f} s (load {run.load:.1f})" + (f"  {run.error}" if run.error else ""), flush=True)
    if args.keep is None and not any(r.error for r in runs.values()):
        shutil.rmtree(out_dir, ignore_errors=True)  # kept when a benchmark failed: the table names its log
    total = time.perf_counter() - started
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    table = rows(runs)
    print_table(table, commit, when, profile)
    print(f"{len(selected)} benchmarks in {total / 60:.1f} min")
    if args.write_results:
        write_results(markdown(table, commit, when, profile, runs, total))
        print(f"appended to {RESULTS}")
    return 0 if all(not r.error for r in runs.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
