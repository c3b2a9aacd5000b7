"""The embedded Kafka broker's jars: Apache Kafka's own (``org.apache.kafka:kafka_2.13``) from Maven Central.

Resolved by the Ivy jar that ships inside pyspark into a cache shared by every run
(``~/.cache/lambda-platform/kafka/<version>/``, beside Spark's Ivy cache), so nothing is installed
by hand.

Guarantee: ``kafka_jars`` resolves at most once per cache and version: concurrent resolvers (two
test workers, two commands) serialise on a lock file, resolve into a temporary folder and rename it
into place, so the version folder, when it exists, is complete.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

from deploy.errors import KafkaJarsError

log = logging.getLogger(__name__)

#: The broker's Maven coordinates (Apache Kafka 4.x runs on Java 17).
KAFKA_GROUP, KAFKA_ARTIFACT, KAFKA_VERSION = "org.apache.kafka", "kafka_2.13", "4.4.0"
#: Kafka logs through SLF4J 1.x; its pom leaves the binding to log4j2 out (the release tarball adds it), so add it,
#: at the log4j2 version Kafka's own dependencies bring.
LOG4J_BINDING = ("org.apache.logging.log4j", "log4j-slf4j-impl", "2.25.5")
#: Where resolved broker jars are kept, one folder per version: beside Spark's Ivy cache (``Settings.spark_ivy_dir``).
DEFAULT_CACHE = Path("~/.cache/lambda-platform/kafka")
MAVEN_CENTRAL = "https://repo1.maven.org/maven2/"
_LOCK = ".resolve.lock"
_PARTIAL = ".resolving-"


def java_binary() -> str:
    """The ``java`` that Spark uses: ``$JAVA_HOME/bin/java``, else the one on PATH."""
    home = os.environ.get("JAVA_HOME")
    if home and Path(home, "bin", "java").exists():
        return str(Path(home, "bin", "java"))
    found = shutil.which("java")
    if found is None:
        raise KafkaJarsError("no Java found (JAVA_HOME unset and no java on PATH): the Kafka broker needs Java 17+; "
                               "install it (apt-get install openjdk-17-jre-headless) or set JAVA_HOME")
    return found


def ivy_jar() -> Path:
    """The Ivy jar inside the installed pyspark (what Spark resolves ``spark.jars.packages`` with)."""
    import pyspark

    found = sorted((Path(pyspark.__file__).parent / "jars").glob("ivy-*.jar"))
    if not found:
        raise KafkaJarsError(f"no ivy-*.jar in {Path(pyspark.__file__).parent / 'jars'}: reinstall pyspark "
                             "(pip install --force-reinstall pyspark)")
    return found[-1]


def kafka_jars(cache_dir: Path = DEFAULT_CACHE, *, version: str = KAFKA_VERSION, repository: str = MAVEN_CENTRAL,
               timeout: float = 900.0) -> Path:
    """The folder holding the broker's jars for ``version`` (its classpath is ``folder/*``), resolved on first use.

    Resolution downloads from ``repository`` (a Maven 2 layout, Maven Central by default) under an
    exclusive lock on ``cache_dir/.resolve.lock``: a second process waits, then finds the folder
    ready. The folder appears complete or not at all (resolved aside, renamed into place); a failed
    resolution leaves nothing behind and raises ``KafkaJarsError``.
    """
    cache_dir = cache_dir.expanduser().resolve()
    target = cache_dir / version
    if _complete(target, version):
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    with _exclusive(cache_dir / _LOCK, "resolving the Kafka jars"):
        if _complete(target, version):  # resolved by another process while this one waited
            return target
        for stale in cache_dir.glob(f"{_PARTIAL}*"):  # left by a resolver that was killed (the lock is ours now)
            shutil.rmtree(stale, ignore_errors=True)
        work = Path(tempfile.mkdtemp(prefix=f"{_PARTIAL}{version}-", dir=cache_dir))
        try:
            started = time.monotonic()
            log.info("resolving the Kafka broker %s:%s:%s from %s into %s (once; about a minute)",
                     KAFKA_GROUP, KAFKA_ARTIFACT, version, repository, target)
            jars = _resolve(work, version, repository, timeout)
            if target.exists():  # an incomplete folder from before this module renamed atomically
                shutil.rmtree(target)
            os.replace(jars, target)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        count = len(list(target.glob("*.jar")))
        log.info("resolved %d Kafka jars (%.0f MB) in %.1f s into %s", count,
                 sum(p.stat().st_size for p in target.glob("*.jar")) / 1e6, time.monotonic() - started, target)
    return target


def _complete(folder: Path, version: str) -> bool:
    return (folder / f"{KAFKA_ARTIFACT}-{version}.jar").is_file() and \
        (folder / f"{LOG4J_BINDING[1]}-{LOG4J_BINDING[2]}.jar").is_file()


@contextmanager
def _exclusive(lock_path: Path, what: str) -> Iterator[None]:
    with lock_path.open("w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("waiting for another process %s (lock %s)", what, lock_path)
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _resolve(work: Path, version: str, repository: str, timeout: float) -> Path:
    """Run Ivy once in ``work``; the folder of retrieved jars."""
    settings = work / "ivysettings.xml"
    root = repository if repository.endswith("/") else repository + "/"
    settings.write_text(
        '<ivysettings>\n  <settings defaultResolver="maven"/>\n  <resolvers>\n'
        f'    <ibiblio name="maven" m2compatible="true" root="{_xml_attr(root)}"/>\n'
        "  </resolvers>\n</ivysettings>\n"
    )
    module = work / "ivy.xml"
    module.write_text(
        '<ivy-module version="2.0">\n  <info organisation="lambda-platform" module="kafka-broker"/>\n'
        "  <dependencies>\n"
        + "".join(f'    <dependency org="{org}" name="{name}" rev="{_xml_attr(rev)}" conf="default->default"/>\n'
                  for org, name, rev in ((KAFKA_GROUP, KAFKA_ARTIFACT, version), LOG4J_BINDING))
        + "  </dependencies>\n</ivy-module>\n"
    )
    jars = work / "jars"
    argv = [java_binary(), "-jar", str(ivy_jar()), "-settings", str(settings), "-cache", str(work / "ivy-cache"),
            "-ivy", str(module), "-confs", "default", "-retrieve", f"{jars}/[artifact]-[revision](-[classifier]).[ext]"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise KafkaJarsError(f"resolving {KAFKA_GROUP}:{KAFKA_ARTIFACT}:{version} from {repository} took over "
                             f"{timeout:.0f} s: check the network or pass a reachable Maven mirror (--repository)") from e
    except OSError as e:
        raise KafkaJarsError(f"cannot run Ivy ({argv[0]} -jar {argv[2]}): {e}") from e
    if done.returncode != 0 or not _complete(jars, version):
        lines = [line.strip() for line in done.stdout.splitlines()]
        missing = [line.removeprefix("module not found: ") for line in lines if line.startswith("module not found:")]
        tried = next((line for line in lines if line.startswith(("http://", "https://", "file:"))), None)
        if missing:
            detail = f"not found: {', '.join(missing)}" + (f" (first URL tried: {tried})" if tried else "")
        else:
            detail = (done.stdout + done.stderr).strip()[-1500:]
        raise KafkaJarsError(
            f"could not resolve the Kafka broker {KAFKA_GROUP}:{KAFKA_ARTIFACT}:{version} from the Maven repository "
            f"{repository}{_unreachable(root)} (Ivy exited {done.returncode}): {detail}. Check that this machine "
            "reaches it, or pass a reachable Maven mirror (--repository URL)")
    return jars


def _unreachable(url: str) -> str:
    """`` (unreachable: <why>)`` if no TCP connection to ``url``'s host can be made, else ``""``."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return ""
    try:
        socket.create_connection((parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)), 5).close()
    except OSError as e:
        return f" (unreachable: {e.strerror or e})"
    return ""


def _xml_attr(text: str) -> str:
    return text.replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;")
