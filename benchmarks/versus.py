"""The same benchmarks on two checkouts of the project, alternated, figure by figure: does a change cost anything?

    python benchmarks/versus.py BEFORE_DIR AFTER_DIR [--only speed_1k batch query freshness] [--rounds 2]

    git worktree add /tmp/before <commit>   # the code before the change (a clean clone works too)
    python benchmarks/versus.py /tmp/before .

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
    figures = json.loads(out.read_text())["figures"]
    return {k: float(v) for k, v in _flat(figures).items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def _flat(figures: dict[str, object], prefix: str = "") -> dict[str, object]:
    flat: dict[str, object] = {}
    for key, value in figures.items():
        if isinstance(value, dict):
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--only", nargs="+", default=["speed_1k", "batch", "query", "freshness"],
                        choices=[b.name for b in BENCHES])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
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
        print(f"\n{bench.name}: median before | median after | after / before   (runs before; after)")
        for name in sorted(set(found["before"]) & set(found["after"])):
            before, after = (statistics.median(found[side][name]) for side in sides)
            ratio = after / before if before else float("nan")
            runs = "; ".join(" ".join(f"{v:,.3g}" for v in found[side][name]) for side in sides)
            print(f"  {name:<36} {before:>12,.4g} | {after:>12,.4g} | {ratio:6.2f}x   ({runs})")
        sys.stdout.flush()
    print(f"\nlogs and figures: {work}")


if __name__ == "__main__":
    main()
