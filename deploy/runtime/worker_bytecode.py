"""Bytecode for the PySpark archives Spark's Python workers import, written once at install.

Spark starts its Python workers (the daemon that forks them, the streaming Python data source's runner,
the planners of a Python data source) with ``$SPARK_HOME/python/lib/pyspark.zip`` and py4j's zip first on
their path, so they import PySpark from those archives, not from the installed package. The wheel's
archives hold source only, and Python never caches bytecode for a zip: each worker process compiled the
PySpark modules it imports again, about a CPU-second a process on this project's hosts (the installed
package, compiled by pip, imports in a fifth of that: benchmarks/worker_start.py). A speed layer's start
runs several such processes, a batch run more, and the suite hundreds.

``python -m deploy.runtime.worker_bytecode`` (``make install`` runs it; so does the Dockerfile) adds a
``.pyc`` beside each ``.py`` in those archives, which Python's zip importer prefers. Guarantees:

- **Never a different program.** Each ``.pyc`` is hash-checked (PEP 552): the importer compares it with
  the source beside it and compiles the source if they differ. A ``.pyc`` of another Python version is
  skipped for the source, as are archives this cannot read.
- **Nothing half-written.** An archive is written to a temporary file beside it and renamed over it,
  entries and their order kept. Run it when no Spark worker is running (an install step): a running
  worker reads the archive it opened, and a file renamed under it would not match.
- **Idempotent.** An archive whose every module already has its ``.pyc`` is left as it is.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import tempfile
import zipfile
from importlib._bootstrap_external import _code_to_hash_pyc  # type: ignore[attr-defined]
from pathlib import Path

log = logging.getLogger(__name__)


def worker_archives() -> list[Path]:
    """The archives Spark puts first on its Python workers' path: ``$SPARK_HOME/python/lib/*.zip``, where
    SPARK_HOME is the one PySpark finds (the environment's, else the installed package's)."""
    from pyspark.find_spark_home import _find_spark_home

    return sorted((Path(_find_spark_home()) / "python" / "lib").glob("*.zip"))


def compile_archive(archive: Path) -> int:
    """Add a hash-checked ``.pyc`` for each ``.py`` of ``archive`` that has none; the number added (0: the
    archive is left untouched; a module this Python cannot compile is left as source). Raises
    ``zipfile.BadZipFile`` or ``OSError`` before anything is replaced."""
    with zipfile.ZipFile(archive) as source:
        names = set(source.namelist())
        missing = {n for n in names if n.endswith(".py") and n + "c" not in names}
        if not missing:
            return 0
        handle, temporary = tempfile.mkstemp(prefix=f".{archive.name}.", dir=archive.parent)
        os.close(handle)
        added = 0
        try:
            with zipfile.ZipFile(temporary, "w", zipfile.ZIP_DEFLATED) as target:
                for info in source.infolist():
                    data = source.read(info)
                    target.writestr(info, data)
                    bytecode = _bytecode(data, info.filename) if info.filename in missing else None
                    if bytecode is not None:
                        target.writestr(zipfile.ZipInfo(info.filename + "c", info.date_time), bytecode,
                                        zipfile.ZIP_DEFLATED)
                        added += 1
            if added:
                os.chmod(temporary, archive.stat().st_mode & 0o777)
                os.replace(temporary, archive)
        finally:
            Path(temporary).unlink(missing_ok=True)
    return added


def _bytecode(source: bytes, filename: str) -> bytes | None:
    """A hash-checked ``.pyc`` of ``source`` for this interpreter (PEP 552's checked mode); None for a source
    this Python cannot compile (left to fail, if ever imported, as it would have)."""
    try:
        code = compile(source, filename, "exec", dont_inherit=True)
    except SyntaxError as e:
        log.warning("%s: no bytecode, it does not compile here: %s", filename, e)
        return None
    return bytes(_code_to_hash_pyc(code, importlib.util.source_hash(source), checked=True))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m deploy.runtime.worker_bytecode",
        description="Add bytecode to the PySpark archives Spark's Python workers import (pyspark.zip, py4j's zip), "
                    "so each worker process does not compile PySpark again. Hash-checked: a changed source is "
                    "compiled as before. Run at install, with no Spark application running.")
    parser.add_argument("archives", nargs="*", type=Path,
                        help="archives to compile (default: $SPARK_HOME/python/lib/*.zip of the PySpark installed)")
    args = parser.parse_args(argv)
    archives = args.archives or worker_archives()
    if not archives:
        parser.error("no archives: PySpark's python/lib holds no .zip (is pyspark installed, SPARK_HOME right?)")
    for archive in archives:
        try:
            added = compile_archive(archive)
        except (OSError, zipfile.BadZipFile) as e:
            parser.exit(1, f"{archive}: not compiled, left as it was: {e}\n")
        print(f"{archive}: {f'bytecode added for {added} modules' if added else 'already compiled'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
