"""The same benchmarks on two checkouts of the project, alternated, figure by figure: does a change cost anything?

    python benchmarks/versus.py BEFORE_DIR AFTER_DIR [--only speed_1k batch query freshness] [--rounds 2]

    git worktree add /tmp/before <commit>   # the code before the change (a clean clone works too)
    python benchmarks/versus.py /tmp/before .
    python benchmarks/versus.py --reread /tmp/lambda-versus-XXXX x x   # the report of a finished run again

Each named benchmark of the suite (``_suite_measures.BENCHES``, quick arguments) runs as a child process
in each checkout (its own scripts, its own code first on ``PYTHONPATH``, this interpreter), before then
after, round after round (B A B A ...): drift on a shared machine hits both sides alike. Every numeric
figure both sides wrote to their ``--json`` file is printed with each side's median and after / before.
Ratios near 1 mean the change costs nothing; read them with the spread of the rounds, printed beside.
Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _suite_measures import BENCHES, Bench


def _run(bench: Bench, checkout: Path, out: Path) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    argv = [sys.executable, *bench.argv(full=False), "--json", str(out)]
    with (out.with_suffix(".log")).open("w") as log:
        rc = subprocess.run(argv, cwd=checkout, env=env, stdout=log, stderr=subprocess.STDOUT,
                            timeout=bench.timeout * 2).returncode
    if rc != 0 or not out.exists():
        print(f"    {bench.name} in {checkout} exited {rc}; see {out.with_suffix('.log')}", flush=True)
        return {}
    return _figures(out)


def _flat(figures: object, prefix: str = "") -> dict[str, object]:
    """Nested figures as ``name.sub[0].leaf`` -> value."""
    if isinstance(figures, dict):
        return {k: v for key, value in figures.items() for k, v in _flat(value, f"{prefix}{key}.").items()}
    if isinstance(figures, list):
        return {k: v for i, value in enumerate(figures) for k, v in _flat(value, f"{prefix[:-1]}[{i}].").items()}
    return {prefix[:-1]: figures}


def _figures(out: Path) -> dict[str, float]:
    figures = json.loads(out.read_text())["figures"]
    return {k: float(v) for k, v in _flat(figures).items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def _report(name: str, found: dict[str, dict[str, list[float]]]) -> None:
    print(f"\n{name}: median before | median after | after / before   (runs before; after)")
    for figure in sorted(set(found["before"]) & set(found["after"])):
        before, after = (statistics.median(found[side][figure]) for side in ("before", "after"))
        ratio = after / before if before else float("nan")
        runs = "; ".join(" ".join(f"{v:,.3g}" for v in found[side][figure]) for side in ("before", "after"))
        print(f"  {figure:<36} {before:>12,.4g} | {after:>12,.4g} | {ratio:6.2f}x   ({runs})")
    sys.stdout.flush()


def _reread(folder: Path) -> None:
    """The report of a finished run from its figure files (``<bench>-<side>-<round>.json``)."""
    by_bench: dict[str, dict[str, dict[str, list[float]]]] = {}
    for out in sorted(folder.glob("*-*-*.json")):
        bench, side, _round = out.stem.rsplit("-", 2)
        found = by_bench.setdefault(bench, {"before": {}, "after": {}})
        for figure, value in _figures(out).items():
            found[side].setdefault(figure, []).append(value)
    for bench, found in by_bench.items():
        _report(bench, found)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--only", nargs="+", default=["speed_1k", "batch", "query", "freshness"],
                        choices=[b.name for b in BENCHES])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--reread", type=Path, help="only print the report of a finished run's folder")
    args = parser.parse_args()
    if args.reread:
        _reread(args.reread)
        return
    sides = {"before": args.before.resolve(), "after": args.after.resolve()}
    work = Path(tempfile.mkdtemp(prefix="lambda-versus-"))
    for bench in (b for b in BENCHES if b.name in args.only):
        found: dict[str, dict[str, list[float]]] = {side: {} for side in sides}
        for round_ in range(1, args.rounds + 1):
            for side, checkout in sides.items():
                started = time.perf_counter()
                figures = _run(bench, checkout, work / f"{bench.name}-{side}-{round_}.json")
                for name, value in figures.items():
                    found[side].setdefault(name, []).append(value)
                print(f"  {bench.name} round {round_} {side}: {len(figures)} figures "
                      f"({time.perf_counter() - started:.0f} s)", flush=True)
        _report(bench.name, found)
    print(f"\nlogs and figures: {work}")


if __name__ == "__main__":
    main()
