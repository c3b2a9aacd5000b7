"""Single-event ingest on a master dataset after an hour of demo traffic, with and without compaction.

    python benchmarks/ingest_after_demo.py                    # an hour of demo traffic: 36,000 commits
    python benchmarks/ingest_after_demo.py --scale 0.1        # quicker: the first 6 minutes of it
    python benchmarks/ingest_after_demo.py --help

The demo traffic (`lambda-platform generate`, `up`'s default) posts ``--rate`` 20 events/s in a
request every 0.1 s: 2 events per request, and each request is one Delta commit with one small
parquet file. This script writes ``--seconds`` of it (``--scale`` of those commits) to a wordcount
master dataset the way HTTP ingest does (``MasterDataset.appender``: one kept delta-rs handle,
one commit per request), as fast as it can instead of in real time. Then it copies that table and
compacts the copy (``MasterDataset.compact``, what `up`'s scheduler does every few minutes),
and measures three tables side by side, in rotation for ``--rounds`` rounds:

* **fresh**: a new master dataset holding one commit of sample events;
* **demo**: the table after the demo traffic, never compacted (what issue 7 saw: 1,201 files
  after three minutes);
* **compacted**: the same table after one compaction;
* **upkept**: the compacted table after the scheduler's log trim (``MasterDataset.trim_log``),
  keeping ``--keep-versions`` versions below the newest: upkeep as ``up`` runs it.

On each: ``--probes`` single-event ingests through a newly opened appender (an API process
that just started; first commit excluded), the latency of opening the table (what every new
process, reader and `ingest` pays), and ``--cli-probes`` single-event ``ingest``-style appends
(open, append, close). Printed: medians and p90 in milliseconds, and the ratios demo/fresh and
compacted/fresh. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _harness import percentile

from batch_layer.master.dataset import MasterDataset
from batch_layer.master.engines import get_engine
from deploy.demo.samples import sample_events
from shared_logic.registry import load_pipeline

TABLES = ("fresh", "demo", "compacted", "upkept")


def _master(path: Path) -> MasterDataset:
    return MasterDataset(path, load_pipeline("wordcount"), get_engine("delta-rs"))


def _events(master: MasterDataset, count: int, seed: int) -> pa.Table:
    return master.pipeline.schema.validate(sample_events("wordcount", count, seed=seed) or [])


def write_demo_traffic(master: MasterDataset, commits: int, per_commit: int) -> float:
    """``commits`` commits of ``per_commit`` events through one kept appender; returns the seconds taken."""
    master.ensure()
    batches = [_events(master, per_commit, seed) for seed in range(50)]
    appender = master.appender()
    started = time.perf_counter()
    for i in range(commits):
        appender.append(batches[i % len(batches)])
        if (i + 1) % max(1, commits // 20) == 0:
            rate = (i + 1) / (time.perf_counter() - started)
            print(f"  demo traffic: {i + 1:,}/{commits:,} commits ({rate:,.0f} commits/s)", flush=True)
    return time.perf_counter() - started


def _timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return (time.perf_counter() - started) * 1000


def measure(master: MasterDataset, probes: int, cli_probes: int, opens: int) -> dict[str, list[float]]:
    """Latencies (ms): single events through a new appender, table opens, open-append-close ingests."""
    one = _events(master, 1, seed=99)
    appender = master.appender()
    appender.append(one)  # the first commit of a new handle is not the steady state
    api = [_timed(lambda: appender.append(one)) for _ in range(probes)]
    open_ms = [_timed(lambda: DeltaTable(str(master.path)).version()) for _ in range(opens)]
    cli = [_timed(lambda: master.append(one)) for _ in range(cli_probes)]
    return {"api append": api, "open table": open_ms, "ingest (open+append)": cli}


def describe(path: Path) -> str:
    table = DeltaTable(str(path))
    files = len(table.file_uris())
    log = path / "_delta_log"
    log_bytes = sum(p.stat().st_size for p in log.iterdir() if p.is_file())
    return f"version {table.version():,}, {files:,} active files, _delta_log {log_bytes / 1e6:.1f} MB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=20.0, help="demo events per second (LAMBDA_GENERATE_RATE)")
    parser.add_argument("--seconds", type=float, default=3600.0, help="how long the demo traffic ran")
    parser.add_argument("--per-commit", type=int, default=2, help="events per request (= per commit): rate x 0.1 s")
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of those commits to write")
    parser.add_argument("--probes", type=int, default=200, help="single-event appends per table and round")
    parser.add_argument("--cli-probes", type=int, default=20, help="open-append-close ingests per table and round")
    parser.add_argument("--opens", type=int, default=20, help="table opens per table and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--keep-versions", type=int, default=1_000,
                        help="upkept table: versions kept below the newest (LAMBDA_MASTER_LOG_KEEP_VERSIONS)")
    parser.add_argument("--dir", type=Path, help="work folder (default: a temporary one, removed after)")
    args = parser.parse_args()

    commits = max(1, int(args.seconds * args.rate / args.per_commit * args.scale))
    work = Path(args.dir or tempfile.mkdtemp(prefix="ingest-after-demo-"))
    paths = {name: work / name for name in TABLES}
    try:
        print(f"writing {commits:,} commits of {args.per_commit} events ({args.scale:g} of {args.seconds:g}s of demo "
              f"traffic at {args.rate:g} events/s) to {paths['demo']}", flush=True)
        seconds = write_demo_traffic(_master(paths["demo"]), commits, args.per_commit)
        print(f"  took {seconds:.1f}s ({commits / seconds:,.0f} commits/s); {describe(paths['demo'])}")
        shutil.copytree(paths["demo"], paths["compacted"])
        started = time.perf_counter()
        result = _master(paths["compacted"]).compact()
        print(f"compaction: {result.files_removed:,} files into {result.files_added} in "
              f"{time.perf_counter() - started:.1f}s; {describe(paths['compacted'])}")
        shutil.copytree(paths["compacted"], paths["upkept"])
        upkept = _master(paths["upkept"])
        keep_from = upkept.latest_version() - args.keep_versions
        trim = upkept.trim_log(keep_from)
        print(f"upkeep (what the scheduler does after a compaction, the served generation and the speed layer at "
              f"version {keep_from:,}): log trimmed to the checkpoint of version {trim.starts_at}, {trim.deleted:,} "
              f"files deleted; {describe(paths['upkept'])}")
        fresh = _master(paths["fresh"])
        fresh.append(_events(fresh, 2_000, seed=7))
        print(f"fresh: {describe(paths['fresh'])}\n")

        results: dict[str, dict[str, list[float]]] = {name: {} for name in TABLES}
        for round_ in range(args.rounds):
            for name in TABLES:
                for metric, values in measure(_master(paths[name]), args.probes, args.cli_probes, args.opens).items():
                    results[name].setdefault(metric, []).extend(values)
            print(f"round {round_ + 1}/{args.rounds} done", flush=True)
        report(results)
    finally:
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)


def report(results: dict[str, dict[str, list[float]]]) -> None:
    print(f"\n{'metric':<22}{'table':<11}{'median ms':>10}{'p90 ms':>9}{'vs fresh':>10}")
    for metric in results["fresh"]:
        base = statistics.median(results["fresh"][metric])
        for name in TABLES:
            values = results[name][metric]
            median = statistics.median(values)
            print(f"{metric:<22}{name:<11}{median:>10.1f}{percentile(values, 0.9):>9.1f}{median / base:>9.2f}x")


if __name__ == "__main__":
    main()
