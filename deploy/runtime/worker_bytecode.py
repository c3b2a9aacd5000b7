"""Bytecode for the PySpark archives Spark's Python workers import, written once at install.

Spark starts its Python workers (the daemon that forks them, the streaming Python data source's runner,
the planners of a Python data source) with ``$SPARK_HOME/python/lib/pyspark.zip`` and py4j's zip first on
their path, so they import PySpark from those archives, not from the installed package. The wheel's
archives hold source only, and Python never caches bytecode for a zip: each worker process compiled the
PySpark modules it imports again, about a CPU-second a process on this project's hosts; with bytecode in the
archive it takes a third of that (benchmarks/worker_start.py). A speed layer's start runs several such
processes, a batch run more, and the suite hundreds.

``python -m deploy.runtime.worker_bytecode`` (``make install`` runs it; so does the Dockerfile) adds a
``.pyc`` beside each ``.py`` in those archives, which Python's zip importer prefers. Guarantees:

- **The same program.** Each ``.pyc`` is hash-checked (PEP 552): the importer compares it with the source
  beside it and compiles the source if they differ, and a ``.pyc`` of another Python version (another magic
  number) is passed over for the source. Its code names the file the importer would name compiling the
  source (``<archive>/pyspark/util.py``), so tracebacks, and PySpark's own filtering of its frames out of a
  UDF's traceback, read as before.
- **Nothing half-written.** An archive is written to a temporary file beside it and renamed over it, every
  entry kept as it was, in order, with the archive's comment. Run it when no Spark worker is running (an
  install step): a running worker reads the archive it opened, and a file renamed under it would not match.
- **Idempotent, and current.** An archive marked compiled by this version of this module for this Python is
  left as it is; otherwise its ``.pyc`` beside a ``.py`` are dropped and written again.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import marshal
import os
import sys
import tempfile
import zipfile
from pathlib import Path

log = logging.getLogger(__name__)

#: An entry naming who compiled the archive (it cannot be imported: its name is no module's). A new format
#: of the bytecode written here gets a new version, so archives compiled before are compiled again.
_MARK = ".lambda-platform-bytecode"
_FORMAT = 2
#: PEP 552 flags: hash-based (bit 0), checked against the source (bit 1).
_CHECKED_HASH = 0b11


def worker_archives() -> list[Path]:
    """The archives Spark puts first on its Python workers' path: ``$SPARK_HOME/python/lib/*.zip``, where
    SPARK_HOME is the one PySpark finds (the environment's, else the installed package's)."""
    from pyspark.find_spark_home import _find_spark_home

    return sorted((Path(_find_spark_home()) / "python" / "lib").glob("*.zip"))


def compile_archive(archive: Path) -> int:
    """Write a hash-checked ``.pyc`` beside each ``.py`` of ``archive``; the number written (0: the archive was
    compiled already and is left untouched; a module this Python cannot compile is left as source). Raises
    ``zipfile.BadZipFile`` or ``OSError`` with the archive as it was."""
    archive = archive.absolute()  # as Spark names it (a symlink's own path): the importer's file names start so
    mark = _mark()
    with zipfile.ZipFile(archive) as source:
        names = set(source.namelist())
        if _MARK in names and source.read(_MARK) == mark:
            return 0
        dropped = {n for n in names if n.endswith(".pyc") and n[:-1] in names} | {_MARK}
        handle, temporary = tempfile.mkstemp(prefix=f".{archive.name}.", dir=archive.parent)
        try:
            os.close(handle)
            written = _rewrite(source, Path(temporary), archive, dropped)
            os.chmod(temporary, archive.stat().st_mode & 0o777)
            os.replace(temporary, archive)
        finally:
            Path(temporary).unlink(missing_ok=True)
    return written


def _rewrite(source: zipfile.ZipFile, temporary: Path, archive: Path, dropped: set[str]) -> int:
    """Copy ``source``'s entries but ``dropped`` to ``temporary``, each ``.py`` followed by its ``.pyc``."""
    written = 0
    with zipfile.ZipFile(temporary, "w", zipfile.ZIP_DEFLATED) as target:
        target.comment = source.comment
        for info in source.infolist():
            if info.filename in dropped:
                continue
            data = source.read(info)
            target.writestr(info, data)
            if not info.filename.endswith(".py"):
                continue
            bytecode = _bytecode(data, os.path.join(archive, *info.filename.split("/")))
            if bytecode is not None:
                compiled = zipfile.ZipInfo(info.filename + "c", info.date_time)
                compiled.external_attr = info.external_attr
                target.writestr(compiled, bytecode, zipfile.ZIP_DEFLATED)
                written += 1
        target.writestr(zipfile.ZipInfo(_MARK, (1980, 1, 1, 0, 0, 0)), _mark())
    return written


def _bytecode(source: bytes, filename: str) -> bytes | None:
    """A hash-checked ``.pyc`` of ``source`` for this interpreter (PEP 552), its code named ``filename``; None for
    a source this Python cannot compile (left to fail, if ever imported, as it would have)."""
    try:
        code = compile(source, filename, "exec", dont_inherit=True)
    except SyntaxError as e:
        log.warning("%s: no bytecode, it does not compile here: %s", filename, e)
        return None
    flags = _CHECKED_HASH.to_bytes(4, "little")
    return importlib.util.MAGIC_NUMBER + flags + importlib.util.source_hash(source) + marshal.dumps(code)


def _mark() -> bytes:
    return f"{sys.implementation.cache_tag} {importlib.util.MAGIC_NUMBER.hex()} format {_FORMAT}\n".encode()


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
    failed = False
    for archive in archives:
        try:
            written = compile_archive(archive)
        except (OSError, zipfile.BadZipFile) as e:
            print(f"{archive}: not compiled, left as it was ({e}); Spark's workers compile it as before",
                  file=sys.stderr)
            failed = True
            continue
        print(f"{archive}: {f'bytecode written for {written} modules' if written else 'compiled already'}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
