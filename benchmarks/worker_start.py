"""A Spark Python worker's imports from PySpark's archives as the wheel ships them, against the same archives
with bytecode (``deploy.runtime.worker_bytecode``, which ``make install`` runs).

    python benchmarks/worker_start.py [--pairs 5]

Each start is a fresh interpreter with the archives first on its path, as Spark starts its workers, importing
what a worker kind imports: the daemon that forks the task workers, a task worker (``pyspark.worker``), and the
streaming Python data source's runner (one per speed-layer query). Side A puts a source-only copy of the
installed archives first (their ``.pyc`` left out, as in the wheel); side B the installed archives. A and B
alternate, pair by pair, so drift hits both alike; the CPU of each side (user + system of the child) and the
ratio B/A per pair and its median are printed. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

#: What each kind of worker process imports first (Spark names the module on its command line).
KINDS = {
    "daemon": "pyspark.daemon",
    "task worker": "pyspark.worker",
    "streaming source runner": "pyspark.sql.streaming.python_streaming_source_runner",
}


def _source_only(archives: list[Path], folder: Path) -> list[Path]:
    """Copies of ``archives`` without their ``.pyc`` entries: the wheel's archives."""
    copies = []
    for archive in archives:
        copy = folder / archive.name
        with zipfile.ZipFile(archive) as source, zipfile.ZipFile(copy, "w", zipfile.ZIP_DEFLATED) as target:
            for info in source.infolist():
                if not info.filename.endswith(".pyc"):
                    target.writestr(info, source.read(info))
        copies.append(copy)
    return copies


def _cpu(path: list[Path], module: str) -> float:
    """CPU seconds of a fresh interpreter importing ``module`` with ``path`` first on its path."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, path))}
    subprocess.run([sys.executable, "-c", f"import {module}"], env=env, check=True, timeout=120)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=5, help="A/B pairs per kind of worker (default 5)")
    args = parser.parse_args()
    from deploy.runtime.worker_bytecode import worker_archives

    installed = worker_archives()
    with zipfile.ZipFile(installed[0]) as archive:
        if not any(name.endswith(".pyc") for name in archive.namelist()):
            sys.exit(f"{installed[0]} has no bytecode: run `python -m deploy.runtime.worker_bytecode` first")
    with tempfile.TemporaryDirectory() as folder:
        wheel = _source_only(installed, Path(folder))
        print(f"{'worker kind':<26} {'pair':>4} {'A: wheel CPU s':>15} {'B: bytecode CPU s':>18} {'B/A':>6}")
        for kind, module in KINDS.items():
            ratios = []
            for pair in range(1, args.pairs + 1):
                a, b = _cpu(wheel, module), _cpu(installed, module)
                ratios.append(b / a)
                print(f"{kind:<26} {pair:>4} {a:>15.2f} {b:>18.2f} {b / a:>6.2f}")
            print(f"{kind:<26} {'':>4} {'':>15} {'median B/A':>18} {statistics.median(ratios):>6.2f}")


if __name__ == "__main__":
    main()
