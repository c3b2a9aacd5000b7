#!/usr/bin/env python
"""Benchmark: the same benchmarks from two checkouts side by side (does a change cost anything at run time?).

    git worktree add /tmp/bench-before 0ea61ec
    .venv/bin/python benchmarks/checkouts_bench.py --before /tmp/bench-before --repeat 2
    .venv/bin/python benchmarks/checkouts_bench.py --before /tmp/bench-before --only query --query-rounds 2

Each checkout runs ITS OWN copy of the benchmark script with ``PYTHONPATH`` = that checkout (so the
product code, Spark's Python workers and the CLI subprocesses are that checkout's), from its own
folder (Spark's Python workers import the project from the driver's folder before ``PYTHONPATH``), in rotation (before after before after ...) for ``--repeat`` rounds:

* ``query``: ``benchmarks/query_bench.py --no-profile`` (the key-read A/B: the platform's endpoint
  against a bare FastAPI endpoint doing one Redis read); figures: A/B, A's and B's median req/s,
  A's p99 at half saturation;
* ``speed``: ``benchmarks/speed_layer_bench.py throughput`` (the speed layer catching up on a
  master dataset, delta-rs engine); figures: events/s and the same run's Spark baseline.

Printed: every run's figures as it finishes, then per figure the medians and the ratio after/before.
Every run's full output is kept in a temporary folder named at the start. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from _harness import ROOT, alternate, git_commit, print_medians

QUERY_FIGURES = {"A/B": r"THROUGHPUT A/B = ([\d.]+)", "A req/s": r"median: A ([\d,]+) req/s",
                 "B req/s": r"median: A [\d,]+ req/s, B ([\d,]+) req/s",
                 "A p99 ms at half": r"A p99 AT HALF SATURATION = ([\d.]+) ms"}
SPEED_FIGURES = {"events/s": r"speed layer: ([\d,]+) events/s", "sustained events/s": r"sustained: ([\d,]+) events/s",
                 "baseline events/s": r"baseline\s*: ([\d,]+) events/s"}
LOWER_IS_BETTER = {"A p99 ms at half"}


def _env(checkout: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAMBDA_")}
    env["PYTHONPATH"] = str(checkout)
    return env


def _commands(kind: str, checkouts: dict[str, Path], args: argparse.Namespace) -> dict[str, tuple[list[str], dict[str, str], Path]]:
    if kind == "query":
        tail = ["--rounds", str(args.query_rounds), "--seconds", str(args.query_seconds), "--no-profile"]
        script = "query_bench.py"
    else:
        tail = ["throughput", "--events", str(args.speed_events), "--versions", str(args.speed_versions),
                "--users", str(args.speed_users)]
        script = "speed_layer_bench.py"
    # each from its own folder: Spark's Python workers import the project from the driver's folder first
    return {name: ([sys.executable, str(co / "benchmarks" / script), *tail], _env(co), co)
            for name, co in checkouts.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", type=Path, required=True, help="the other checkout (e.g. a git worktree)")
    parser.add_argument("--after", type=Path, default=ROOT, help="default: this checkout")
    parser.add_argument("--only", choices=("query", "speed"), nargs="+", default=["query", "speed"])
    parser.add_argument("--repeat", type=int, default=2, help="runs of each checkout per benchmark (default 2)")
    parser.add_argument("--query-rounds", type=int, default=2, help="query_bench.py --rounds (default 2)")
    parser.add_argument("--query-seconds", type=float, default=8.0, help="query_bench.py --seconds (default 8)")
    parser.add_argument("--speed-events", type=int, default=500_000)
    parser.add_argument("--speed-versions", type=int, default=100)
    parser.add_argument("--speed-users", type=int, default=1_000)
    args = parser.parse_args(argv)
    checkouts = {"before": args.before.resolve(), "after": args.after.resolve()}
    log_dir = Path(tempfile.mkdtemp(prefix="lp-checkouts-"))
    for name, co in checkouts.items():
        head, changed = git_commit("benchmarks", "batch_layer", "serving", "deploy", "speed_layer", "shared_logic",
                                   checkout=co)
        print(f"{name}: {co} (commit {head}" + (f" + uncommitted {', '.join(changed)})" if changed else ")"))
    print(f"each run's output: {log_dir}", flush=True)
    for kind in args.only:
        print(f"\n== {kind}: {args.repeat} runs of each checkout in rotation", flush=True)
        # The sustained rate is printed only by runs of more than one micro-batch, from b5ccd07 on.
        found = alternate(_commands(kind, checkouts, args), QUERY_FIGURES if kind == "query" else SPEED_FIGURES,
                          repeat=args.repeat, log_dir=log_dir / kind, optional=frozenset({"sustained events/s"}))
        for fig in next(iter(found.values())):
            if not all(f[fig] for f in found.values()):
                print(f"\n{kind}: {fig}: not printed by every checkout's runs")
                continue
            print_medians(f"{kind}: {fig}", {name: f[fig] for name, f in found.items()}, baseline="before",
                          unit="", higher_is_better=fig not in LOWER_IS_BETTER)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
