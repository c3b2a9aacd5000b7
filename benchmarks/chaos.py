"""The full chaos run: `lambda-platform up` under kill -9 faults and forced recomputes, audited against an oracle.

    .venv/bin/python benchmarks/chaos.py                        # 50 faults (about 20-30 minutes on 2 cores)
    .venv/bin/python benchmarks/chaos.py --faults 100 --duration 3600
    .venv/bin/python benchmarks/chaos.py --faults 20 --kinds redis,up --keep
    .venv/bin/python benchmarks/chaos.py --faults 10 --kinds speed --rate 20   # speed-layer restarts at the demo's rate

What it does (tests/chaos/harness.py; the slow test tests/chaos/test_chaos.py runs the same with
about 10 faults):

* starts `lambda-platform up --no-generate` (pipeline wordcount) on a fresh data dir, a free port
  and an API key of its own, as a process tree marked with an environment variable;
* writers post JSON arrays of events, each request under its own Idempotency-Key, and retry it
  (same bytes) until it is acknowledged with 202;
* a reader polls key answers of a few words and the top-N, and checks each answer as it comes:
  never above what was sent for the word (acknowledged + the request in flight), and neither the
  value nor `version` lower than the highest ever served for that word;
* a fault injector kills at random (SIGKILL of the process group) the speed layer, the API, the
  scheduler, Redis, or every process of the tree (then starts `up` again), or forces a recompute
  (POST /v1/batch/runs {"force": true}); after each kill it waits until answers are fresh again;
* at the end it stops the writers, waits for the platform to settle and audits: each key in
  exactly one commit of the master's Delta log (the one its 202 named), each commit holding
  exactly its requests' events, the oracle over the master table equal to the oracle over the
  baseline plus every acknowledged request, every row of every view and every top-N served equal
  to that oracle, and every live answer equal to the exact count at the version it named.

It prints a summary table (faults by kind, acknowledged events, answers checked, violations
with examples, recovery times, memory of each part, and how long the speed layer's starts took to
reach each stage its log tells: Spark session, query started, first micro-batch, caught up) and
exits 1 if any violation was found.
Every process it started is killed at the end, also on Ctrl-C or an error. The data dir and
logs are deleted unless --keep (or --work-dir) is given.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.chaos.faults import FAULT_KINDS, FaultPlan
from tests.chaos.harness import ChaosConfig, run_chaos


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="benchmarks/chaos.py", description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 2)[2], formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--faults", type=int, default=50, help="stop after this many faults (default 50; 0: no limit)")
    parser.add_argument("--duration", type=float, default=0,
                        help="stop injecting after this many seconds (default 0: no limit); whichever comes first")
    parser.add_argument("--kinds", default=",".join(FAULT_KINDS),
                        help=f"comma-separated fault kinds (default all: {','.join(FAULT_KINDS)})")
    parser.add_argument("--gap", type=float, nargs=2, default=(5.0, 20.0), metavar=("MIN", "MAX"),
                        help="seconds of traffic between faults, drawn uniformly (default 5 20)")
    parser.add_argument("--rate", type=float, default=40.0, help="events per second over all writers (default 40)")
    parser.add_argument("--writers", type=int, default=2, help="concurrent writers (default 2)")
    parser.add_argument("--max-batch", type=int, default=30,
                        help="most events per request, drawn uniformly from 1 (default 30)")
    parser.add_argument("--schedule", default="1h", help="LAMBDA_BATCH_SCHEDULE of the platform (default 1h)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the fault order and the events (default 0)")
    parser.add_argument("--recovery-timeout", type=float, default=300.0,
                        help="longest wait for a killed part to be back with fresh answers (default 300)")
    parser.add_argument("--line-separators", action="store_true",
                        help="also write words holding U+2028 / U+0085 (issue 7, bug 1: retries of such requests)")
    parser.add_argument("--work-dir", type=Path, help="data dir and logs here (kept); default: a temporary dir")
    parser.add_argument("--keep", action="store_true", help="keep the temporary dir (data and logs) afterwards")
    args = parser.parse_args(argv)
    if args.faults <= 0 and args.duration <= 0:
        parser.error("give --faults or --duration: a chaos run must end")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="lambda-chaos-"))
    work_dir.mkdir(parents=True, exist_ok=True)
    plan = FaultPlan(max_faults=args.faults or None, duration=args.duration or None,
                     kinds=tuple(k.strip() for k in args.kinds.split(",") if k.strip()),
                     min_gap=args.gap[0], max_gap=args.gap[1], recovery_timeout=args.recovery_timeout, seed=args.seed)
    config = ChaosConfig(work_dir=work_dir, plan=plan, rate=args.rate, writers=args.writers,
                         max_batch=args.max_batch, batch_schedule=args.schedule, line_separators=args.line_separators)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind, so every process of the run is killed
    try:
        result = run_chaos(config, lambda message: print(message, flush=True))
    finally:
        if args.work_dir is None and not args.keep:
            shutil.rmtree(work_dir, ignore_errors=True)
    print()
    print(result.table())
    return 1 if result.findings.violations else 0


if __name__ == "__main__":
    sys.exit(main())
