"""`lambda-platform batch run` with the Spark driver's classes from the install's class-data-sharing archive, against
from the jars.

    python benchmarks/class_archive_bench.py [--pairs 4] [--events 2000]

First the install's training (``python -m deploy.runtime.class_archive_training``) writes the archives into a
temporary folder, timed: that is what `make install` pays once. Then each pair runs the same command on the same
wordcount master, a fresh process each time: side A with class-data sharing off (``LAMBDA_SPARK_CLASS_ARCHIVE_DIR``
empty: what every driver of a jar set paid before its first archive was written), side B mapping the trained
archive. A and B alternate, so drift hits both alike; the wall seconds and the CPU seconds of the command and the
processes it waits for (the JVM and its Python workers; the embedded Redis runs as a daemon and is not counted) are
printed per pair with the ratio B/A, and their medians. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_WORDS = ["lambda", "kappa", "spark", "delta", "redis", "kafka", "stream", "batch", "serve", "merge"]


def _timed(command: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU seconds (the command's process tree, every process it waited for) of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.monotonic()
    subprocess.run(command, env=env, check=True, capture_output=True, timeout=900)
    wall = time.monotonic() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=4, help="A/B pairs (default 4)")
    parser.add_argument("--events", type=int, default=2000, help="wordcount events in the master (default 2000)")
    args = parser.parse_args()
    cli = [sys.executable, "-m", "deploy.cli"]
    with tempfile.TemporaryDirectory(prefix="bench-class-archive-") as tmp:
        folder, data = Path(tmp) / "cds", Path(tmp) / "data"
        base = {**os.environ, "LAMBDA_PIPELINE": "wordcount", "LAMBDA_DATA_DIR": str(data), "LAMBDA_ENV_FILE": os.devnull}
        trained = {**base, "LAMBDA_SPARK_CLASS_ARCHIVE_DIR": str(folder)}
        unshared = {**base, "LAMBDA_SPARK_CLASS_ARCHIVE_DIR": ""}
        wall, cpu = _timed([sys.executable, "-m", "deploy.runtime.class_archive_training"], trained)
        print(f"training (make install's step, once): {wall:.1f} s wall, {cpu:.1f} CPU-s; "
              f"archives: {', '.join(p.name for p in sorted(folder.glob('*.jsa')))}")
        events = Path(tmp) / "events.jsonl"
        events.write_text("".join(json.dumps({"text": " ".join(_WORDS[(i * 7 + k) % 10] for k in range(i % 5 + 1))}) + "\n"
                                  for i in range(args.events)))
        subprocess.run([*cli, "ingest", str(events)], env=unshared, check=True, capture_output=True, timeout=300)
        _timed([*cli, "batch", "run"], unshared)  # warm-up: the page cache holds the jars and the archive
        rows = []
        print(f"{'pair':>4} {'A wall':>8} {'B wall':>8} {'ratio':>6} {'A CPU':>8} {'B CPU':>8} {'ratio':>6}")
        for pair in range(1, args.pairs + 1):
            a = _timed([*cli, "batch", "run"], unshared)
            b = _timed([*cli, "batch", "run"], trained)
            rows.append((a, b))
            print(f"{pair:>4} {a[0]:>8.1f} {b[0]:>8.1f} {b[0] / a[0]:>6.2f} {a[1]:>8.1f} {b[1]:>8.1f} {b[1] / a[1]:>6.2f}")
        wall_ratio = statistics.median(b[0] / a[0] for a, b in rows)
        cpu_ratio = statistics.median(b[1] / a[1] for a, b in rows)
        print(f"median ratio B/A (archive / jars): wall {wall_ratio:.2f}, CPU {cpu_ratio:.2f}")


if __name__ == "__main__":
    main()
