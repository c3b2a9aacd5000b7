"""Maven packages resolved once: later Spark drivers load the jars Spark resolved, without Ivy.

Spark resolves ``spark.jars.packages`` with Ivy at every driver start: a second or more for Delta,
about 15 s for the S3A set of 36 modules, and a look at the network when the cache has expired.
The first driver resolves as before, and the jars it got are recorded beside the Ivy cache; a later
driver with the same packages, exclusions, repositories and extra jars gets ``spark.jars`` set to
that list instead, which Spark loads as it loads the jars it resolves itself (the same files, on the
driver's class path and shipped to the executors alike). Ivy does not lock its own downloads, so a
driver that resolves holds a lock beside the cache until it has recorded (``resolving``): drivers
started side by side (`up`'s parts, two test workers, two trainings) resolve one at a time, and the
ones that waited find the first's record and resolve nothing.

Guarantees: a record is keyed by everything that decides a resolution (and by the Spark version,
which sets Spark's own exclusions), and written whole (a rename), so drivers starting together read
a complete list or none. A record naming a jar that is not on disk (a cleaned cache) is ignored:
that driver resolves again and records anew. A driver never gets jars another resolution chose.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlparse

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

#: What decides the jars a resolution gives.
_DECIDING = ("spark.jars.packages", "spark.jars.excludes", "spark.jars.repositories", "spark.jars.ivySettings",
             "spark.jars")
_RESOLUTION = ("spark.jars.packages", "spark.jars.excludes", "spark.jars.repositories", "spark.jars.ivySettings")


@contextmanager
def resolving(options: dict[str, str]) -> Iterator[bool]:
    """Whether the driver about to start with ``options`` resolves its packages with Ivy: False when a complete
    record replaced them with its jars (in place, ``use_recorded``). A driver that resolves holds an exclusive
    lock beside the Ivy cache for the block (its start and ``record``); one that waited for it looks for a record
    again, and starts from it without the lock. Options without packages resolve nothing and take no lock (True:
    nothing to record either); a lock that cannot be made (a read-only cache) is skipped, with a warning."""
    if use_recorded(options):
        yield False
        return
    ivy = options.get("spark.jars.ivy")
    if not options.get("spark.jars.packages") or not ivy:
        yield True
        return
    lock = _lock(Path(ivy).expanduser() / ".lambda-resolve.lock")
    try:
        resolves = not use_recorded(options)  # a driver that waited finds the first one's record
        if not resolves and lock is not None:
            os.close(lock)  # nothing to resolve, nothing to hold through this driver's start
            lock = None
        yield resolves
    finally:
        if lock is not None:
            os.close(lock)  # the lock goes with it (a killed holder's too)


def _lock(path: Path) -> int | None:
    """An open descriptor of ``path`` holding its exclusive lock, once other holders let go (a wait is logged);
    None, with a warning, when the lock cannot be made (a read-only cache): the driver resolves without it."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as e:
        log.warning("resolving without the Ivy cache's lock: %s", e)
        return None
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("waiting for another Spark driver resolving its packages (lock %s)", path)
            fcntl.flock(lock, fcntl.LOCK_EX)
    except BaseException:  # Ctrl-C while waiting, say
        os.close(lock)
        raise
    return lock


def use_recorded(options: dict[str, str]) -> bool:
    """Replace ``options``' packages with the jars recorded for them, if a complete record exists (in place).

    Returns whether it did. Options without packages, or without an Ivy cache folder, are left alone."""
    record = _record_path(options)
    if record is None or not record.is_file():
        return False
    jars = [line for line in record.read_text().splitlines() if line]
    if not jars or not all(_local(jar).is_file() for jar in jars):
        log.info("the jars recorded for %s are not all on disk: resolving again", options["spark.jars.packages"])
        return False
    for key in _RESOLUTION:
        options.pop(key, None)
    options["spark.jars"] = ",".join(jars)
    return True


def record(options: dict[str, str], spark: SparkSession) -> None:
    """Record the jars the running driver resolved for ``options``' packages (the options it was built with)."""
    path = _record_path(options)
    jars = spark.sparkContext.getConf().get("spark.jars", "")
    if path is None or not jars:
        return
    partial = path.with_name(f"{path.name}.{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial.write_text("\n".join(j for j in jars.split(",") if j) + "\n")
        os.replace(partial, path)
    except OSError as e:  # a read-only cache: the next driver resolves again
        log.warning("could not record the resolved jars in %s: %s", path.parent, e)


def _record_path(options: dict[str, str]) -> Path | None:
    import pyspark

    if not options.get("spark.jars.packages") or not options.get("spark.jars.ivy"):
        return None
    key = "\0".join([pyspark.__version__, *(str(options.get(k, "")) for k in _DECIDING)])
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return Path(options["spark.jars.ivy"]).expanduser() / "resolved" / f"{digest}.jars"


def _local(jar: str) -> Path:
    parsed = urlparse(jar)
    return Path(unquote(parsed.path)) if parsed.scheme in ("file", "local") else Path(jar)
