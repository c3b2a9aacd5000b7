"""The Spark driver JVM's class-data-sharing archive: the same classes, loaded from a mapped file.

A Spark driver spends most of its start-up loading and verifying some 20,000 classes; a restarted
speed layer waits for that before it can catch up. Java's dynamic class-data sharing (JDK 13+)
writes the classes a JVM loaded to an archive when it exits, and later JVMs map that archive
instead of parsing their jars again.

Guarantees:

- Sharing never changes what a JVM runs: the JVM checks the archive against its own class path and
  Java build, and on any mismatch (or an unreadable file) it loads from the jars as before
  (``-Xshare:auto``). The archive's name is a hash of what decides the classes (the Java and Spark
  installations, the extra jars), so a new version starts a new archive.
- An archive is written once: the first driver that finds none and exits normally (a one-shot
  command; a long-running part that is killed writes nothing) writes a private file, which is
  renamed into place only after its JVM has exited, so no JVM ever maps a half-written archive.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
from pathlib import Path

log = logging.getLogger(__name__)

#: CDS's notes (classes it skips, a mismatch it works around) would otherwise go to the JVM's stdout.
_QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"
_pending: Path | None = None
#: Archives kept in the folder, the newest: one per Spark installation (a checkout's venv) and engine in use,
#: e.g. a working copy's and a CI clone's, each with delta-rs and delta-spark.
_KEEP = 4


def archive_options(folder: Path | None, spark_options: dict[str, str]) -> str:
    """JVM options that use the archive in ``folder`` for this Spark, or write it at exit if there is none.

    ``folder`` None: no options (sharing off). ``spark_options``: the builder's settings, whose extra
    jars are part of the archive's identity.
    """
    global _pending
    if folder is None:
        return ""
    folder = folder.expanduser()
    archive = folder / f"spark-{_identity(spark_options)}.jsa"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        _remove_orphans(folder)  # every time: a process that never adopts (a test session's JVM) leaves one
    except OSError as e:  # a read-only cache: run without sharing, say so once
        log.warning("no class-data-sharing archive (JVM start-up is slower): %s", e)
        return ""
    if archive.is_file():
        return f"-XX:SharedArchiveFile={archive} -Xshare:auto {_QUIET}"
    _pending = folder / f"{archive.name}.{os.getpid()}.partial"
    return f"-XX:ArchiveClassesAtExit={_pending} {_QUIET}"


def adopt_archive() -> None:
    """Once this process's JVM has exited: move the archive it wrote at exit into place, if it wrote one."""
    global _pending
    written, _pending = _pending, None
    if written is None or not written.is_file():
        return
    final = written.parent / written.name.rsplit(".", 2)[0]
    os.replace(written, final)  # atomic; a JVM that mapped an earlier copy keeps its own inode
    log.info("wrote the Spark class-data-sharing archive %s: later Spark JVMs start faster", final)
    _keep_newest(final.parent)


def _keep_newest(folder: Path) -> None:
    """Delete all but the newest ``_KEEP`` archives (each checkout, engine or upgrade writes one of ~200 MB); a JVM
    that mapped a deleted one keeps it until it exits."""
    archives = sorted(folder.glob("spark-*.jsa"), key=lambda p: p.stat().st_mtime, reverse=True)
    for stale in archives[_KEEP:]:
        stale.unlink(missing_ok=True)


def _identity(spark_options: dict[str, str]) -> str:
    """A hash of what decides the archive's classes: the Java binary, Spark's jars and the extra jars."""
    import pyspark

    java = Path(os.environ["JAVA_HOME"], "bin", "java") if os.environ.get("JAVA_HOME") else None
    java_path = java if java is not None and java.exists() else Path(shutil.which("java") or "java")
    java_file = java_path.resolve()
    parts = [
        str(java_file), str(java_file.stat().st_mtime_ns) if java_file.exists() else "",
        str(Path(pyspark.__file__).parent), pyspark.__version__,
        *(spark_options.get(k, "") for k in ("spark.jars.packages", "spark.jars", "spark.driver.extraClassPath")),
    ]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def _remove_orphans(folder: Path) -> None:
    """Delete partial archives whose writer is gone (a JVM stopped during its dump, or never renamed)."""
    for partial in folder.glob("*.partial"):
        pid = partial.name.rsplit(".", 2)[-2]
        if not pid.isdigit() or not _alive(int(pid)):
            partial.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
