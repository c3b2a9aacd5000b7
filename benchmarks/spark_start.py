"""A Spark driver's start with its Maven packages resolved by Ivy, against the jars recorded last time.

    python benchmarks/spark_start.py [--pairs 4] [--s3]

Each start is a fresh process that builds the platform's SparkSession (``deploy.runtime.spark``) for the
delta-spark engine (``--s3``: with the S3A jars too, 36 modules) and stops it; the class-data-sharing
archive is off on both sides so only the resolution differs. Side A resolves with Ivy (the record is
removed first, as on a first start); side B starts from the record A left (``deploy.runtime.resolved_jars``).
A and B alternate, pair by pair, so drift hits both alike; the ratio B/A per pair and its median are
printed. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time

_CHILD = """
import json, sys, time
started = time.monotonic()
from deploy.runtime.spark import build_spark
from deploy.settings import load_settings
overrides = json.loads(sys.argv[1])
spark = build_spark(load_settings(**overrides), "bench-spark-start")
ready = time.monotonic() - started
used = "packages" if spark.sparkContext.getConf().get("spark.jars.packages", "") else "recorded"
spark.stop()
print(json.dumps({"ready": ready, "used": used}))
"""


def _start(overrides: dict[str, str]) -> tuple[float, float, str]:
    began = time.monotonic()
    done = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(overrides)], capture_output=True, text=True,
                          timeout=600, check=True)
    said = json.loads(done.stdout.strip().splitlines()[-1])
    return said["ready"], time.monotonic() - began, said["used"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=4, help="A/B pairs (default 4)")
    parser.add_argument("--s3", action="store_true", help="the S3A jar set too (no object store is contacted: the session only starts)")
    args = parser.parse_args()
    from deploy.settings import Settings

    ivy = Settings.model_fields["spark_ivy_dir"].default.expanduser()
    with tempfile.TemporaryDirectory(prefix="bench-spark-start-") as tmp:
        overrides = {"data_dir": tmp, "storage_engine": "delta-spark", "spark_master": "local[1]",
                     "spark_class_archive_dir": ""}
        if args.s3:
            overrides.update({"tables_uri": "s3a://bench/tables", "s3_endpoint_url": "http://127.0.0.1:9"})
        _start(overrides)  # warm-up: the Ivy cache holds the jars, the page cache the classes
        rows = []
        for pair in range(args.pairs):
            for record in (ivy / "resolved").glob("*.jars"):
                record.unlink()
            a = _start(overrides)
            b = _start(overrides)
            assert (a[2], b[2]) == ("packages", "recorded"), (a, b)
            rows.append((a, b))
            print(f"pair {pair + 1}: ready {a[0]:.1f} s (Ivy) vs {b[0]:.1f} s (recorded), ratio {b[0] / a[0]:.2f}; "
                  f"process {a[1]:.1f} vs {b[1]:.1f} s", flush=True)
    ready = [b[0] / a[0] for a, b in rows]
    print(f"median ready ratio recorded/Ivy: {statistics.median(ready):.2f} "
          f"(min {min(ready):.2f}, max {max(ready):.2f}); median ready {statistics.median(a[0] for a, _ in rows):.1f} s "
          f"vs {statistics.median(b[0] for _, b in rows):.1f} s")


if __name__ == "__main__":
    main()
