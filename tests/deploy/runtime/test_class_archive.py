"""The class-data-sharing archive: written once by a JVM that exits, moved into place after it, mapped later.

A real `java` runs with the options the module gives (``-version``: a JVM that loads classes and
exits); ``-Xshare:on`` then makes a JVM fail unless it maps the archive, so a usable archive is
proven by the JVM itself. Spark is not needed: the options are the JVM's own.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from deploy.runtime import class_archive

pytestmark = pytest.mark.skipif(shutil.which("java") is None, reason="needs a Java runtime")

_SPARK = {"spark.jars.packages": "io.delta:delta-spark_2.13:4.0.0"}


def _java(options: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["java", *shlex.split(options), *extra, "-version"], capture_output=True, text=True,
                          timeout=120)


def test_the_first_jvm_writes_the_archive_and_the_next_one_maps_it(tmp_path: Path) -> None:
    folder = tmp_path / "cds"
    dump = class_archive.archive_options(folder, _SPARK)
    assert "-XX:ArchiveClassesAtExit=" in dump
    assert _java(dump).returncode == 0
    assert not list(folder.glob("*.jsa")), "nothing is in place before the writer's JVM has exited"
    class_archive.adopt_archive()
    [archive] = folder.glob("*.jsa")
    assert not list(folder.glob("*.partial"))

    use = class_archive.archive_options(folder, _SPARK)
    assert f"-XX:SharedArchiveFile={archive}" in use
    mapped = _java(use.replace("-Xshare:auto", ""), "-Xshare:on")
    assert mapped.returncode == 0, mapped.stderr


def test_a_partial_archive_left_by_a_dead_writer_goes_even_when_an_archive_is_in_place(tmp_path: Path) -> None:
    folder = tmp_path / "cds"
    folder.mkdir()
    in_place = class_archive.archive_options(folder, _SPARK).split("=", 1)[1].split()[0].rsplit(".", 2)[0]
    Path(in_place).write_bytes(b"archive")  # this Spark's archive is in place
    orphan = folder / "spark-0123456789abcdef.jsa.999999999.partial"  # a test session's JVM: never adopted
    orphan.write_bytes(b"x")
    assert class_archive.archive_options(folder, _SPARK).startswith(f"-XX:SharedArchiveFile={in_place} ")
    assert not orphan.exists()


def test_another_spark_gets_its_own_archive_and_none_means_off(tmp_path: Path) -> None:
    folder = tmp_path / "cds"
    first = class_archive.archive_options(folder, _SPARK)
    other = class_archive.archive_options(folder, {"spark.jars.packages": "org.apache.spark:spark-sql-kafka"})
    assert first.split("=")[1].split(".jsa")[0] != other.split("=")[1].split(".jsa")[0]
    assert class_archive.archive_options(None, _SPARK) == ""


def test_partial_archives_of_dead_writers_go_and_only_the_newest_archives_stay(tmp_path: Path) -> None:
    folder = tmp_path / "cds"
    folder.mkdir()
    dead = folder / "spark-0123456789abcdef.jsa.999999999.partial"  # no such pid
    alive = folder / f"spark-0123456789abcdef.jsa.{os.getpid()}.partial"
    dead.write_bytes(b"x")
    alive.write_bytes(b"x")
    for age, name in enumerate(["a", "b", "c", "d", "e"]):
        stale = folder / f"spark-{name * 16}.jsa"
        stale.write_bytes(b"x")
        os.utime(stale, (1_000_000 + age, 1_000_000 + age))

    dump = class_archive.archive_options(folder, _SPARK)
    assert not dead.exists() and alive.exists(), "a live writer's partial archive is its own"
    written = Path(dump.split("=", 1)[1].split()[0])
    written.write_bytes(b"archive")  # what its JVM writes at exit
    class_archive.adopt_archive()

    kept = {p.name for p in folder.glob("*.jsa")}
    assert kept == {written.name.rsplit(".", 2)[0], "spark-eeeeeeeeeeeeeeee.jsa", "spark-dddddddddddddddd.jsa",
                    "spark-cccccccccccccccc.jsa"}
