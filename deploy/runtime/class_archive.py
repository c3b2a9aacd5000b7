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
- An archive is written once, by one JVM: the first driver that finds none claims it (a claim
  file, under a lock, so JVMs starting together do not all spend a core on the same dump at exit);
  later drivers run without sharing until it is in place. The claim holder writes a private file
  at normal exit, renamed into place only after its JVM has exited, so no JVM maps a half-written
  archive; a claim whose process is gone (killed, or never adopting) is taken over by the next.
- Archives of this Spark installation are never evicted by others': the folder keeps every archive
  of the installation in use (one per set of extra jars) and the newest of other installations.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
from pathlib import Path

log = logging.getLogger(__name__)

#: CDS's notes (classes it skips, a mismatch it works around) would otherwise go to the JVM's stdout.
_QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"
_pending: Path | None = None
#: Archives kept in the folder: all of the installation in use, and of others (a CI clone, an older venv) the
#: newest, up to this many in all (each is ~200 MB).
_KEEP = 4


def archive_options(folder: Path | None, spark_options: dict[str, str]) -> str:
    """JVM options that use the archive in ``folder`` for this Spark, or claim it and write it at exit if
    there is none and nobody else is writing it.

    ``folder`` None: no options (sharing off). ``spark_options``: the builder's settings, whose extra
    jars are part of the archive's identity.
    """
    global _pending
    if folder is None:
        return ""
    archive = archive_path(folder, spark_options)
    folder = archive.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with _locked(folder):
            _remove_orphans(folder)  # every time: a process that never adopts (a test session's JVM) leaves one
            if archive.is_file():
                return f"-XX:SharedArchiveFile={archive} -Xshare:auto {_QUIET}"
            if any(folder.glob(f"{archive.name}.*.partial")):
                return ""  # another live process claimed it: run as without sharing, write nothing
            claim = folder / f"{archive.name}.{os.getpid()}.partial"
            claim.touch()  # the claim; the JVM writes over it at exit
            _pending = claim
    except OSError as e:  # a read-only cache: run without sharing, say so once
        log.warning("no class-data-sharing archive (JVM start-up is slower): %s", e)
        return ""
    return f"-XX:ArchiveClassesAtExit={_pending} {_QUIET}"


def archive_path(folder: Path, spark_options: dict[str, str]) -> Path:
    """Where the archive of a Spark driver with the builder's settings ``spark_options`` is, or would be, in
    ``folder``: named after this Java and Spark installation and the driver's extra jars."""
    installation, extras = _identity(spark_options)
    return folder.expanduser() / f"spark-{installation}-{extras}.jsa"


def claimed() -> bool:
    """Whether this process's JVM claimed an archive: it writes it at exit, and ``adopt_archive`` moves it in."""
    return _pending is not None


def adopt_archive() -> None:
    """Once this process's JVM has exited: move the archive it wrote at exit into place, if it wrote one
    (a claim the JVM did not write over, being empty, is dropped: the next driver claims again)."""
    global _pending
    written, _pending = _pending, None
    if written is None or not written.is_file():
        return
    if written.stat().st_size == 0:
        written.unlink(missing_ok=True)
        return
    final = written.parent / written.name.rsplit(".", 2)[0]
    os.replace(written, final)  # atomic; a JVM that mapped an earlier copy keeps its own inode
    log.info("wrote the Spark class-data-sharing archive %s: later Spark JVMs start faster", final)
    with _locked(final.parent):  # another process's adoption may be choosing what to keep too
        _keep(final.parent, installation=final.name.split("-")[1])


def discard_claim() -> None:
    """Give up this process's claim (its JVM's run went wrong): nothing is adopted, the next driver claims
    again, and what its JVM may still write at exit is an orphan the next ``archive_options`` deletes."""
    global _pending
    claim, _pending = _pending, None
    if claim is not None:
        claim.unlink(missing_ok=True)


def _keep(folder: Path, *, installation: str) -> None:
    """Delete other installations' archives beyond the newest, keeping ``_KEEP`` in all and every archive of
    ``installation``; a JVM that mapped a deleted one keeps it until it exits."""
    archives = sorted(folder.glob("spark-*.jsa"), key=lambda p: p.stat().st_mtime, reverse=True)
    own = [p for p in archives if p.name.split("-")[1] == installation]
    others = [p for p in archives if p not in own]
    for stale in others[max(_KEEP - len(own), 0):]:
        stale.unlink(missing_ok=True)


def _identity(spark_options: dict[str, str]) -> tuple[str, str]:
    """Hashes of what decides the archive's classes: the installation (the Java binary, Spark's jars), and
    the extra jars."""
    import pyspark

    java = Path(os.environ["JAVA_HOME"], "bin", "java") if os.environ.get("JAVA_HOME") else None
    java_path = java if java is not None and java.exists() else Path(shutil.which("java") or "java")
    java_file = java_path.resolve()
    installation = [
        str(java_file), str(java_file.stat().st_mtime_ns) if java_file.exists() else "",
        str(Path(pyspark.__file__).parent), pyspark.__version__,
    ]
    extras = [spark_options.get(k, "") for k in ("spark.jars.packages", "spark.jars", "spark.driver.extraClassPath")]
    return _hash(installation), _hash(extras)


def _hash(parts: list[str]) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:12]


class _locked:
    """An exclusive lock on ``folder``'s lock file for the with-block: claims are checked and made under it."""

    def __init__(self, folder: Path) -> None:
        self._path = folder / ".lock"

    def __enter__(self) -> None:
        self._file = self._path.open("a")
        fcntl.flock(self._file, fcntl.LOCK_EX)

    def __exit__(self, *_: object) -> None:
        self._file.close()


def _remove_orphans(folder: Path) -> None:
    """Delete claims and partial archives whose writer is gone (killed, stopped during its dump, never adopted)."""
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
