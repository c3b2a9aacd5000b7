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
    orphan = folder / "spark-0123456789ab-0123456789ab.jsa.999999999.partial"  # a test session's JVM: never adopted
    orphan.write_bytes(b"x")
    assert class_archive.archive_options(folder, _SPARK).startswith(f"-XX:SharedArchiveFile={in_place} ")
    assert not orphan.exists()


def test_another_spark_gets_its_own_archive_and_none_means_off(tmp_path: Path) -> None:
    folder = tmp_path / "cds"
    first = class_archive.archive_options(folder, _SPARK)
    other = class_archive.archive_options(folder, {"spark.jars.packages": "org.apache.spark:spark-sql-kafka"})
    assert first.split("=")[1].split(".jsa")[0] != other.split("=")[1].split(".jsa")[0]
    assert class_archive.archive_options(None, _SPARK) == ""


def _claimed(options: str) -> Path:
    return Path(options.split("=", 1)[1].split()[0])


def test_one_writer_at_a_time_and_a_dead_writers_claim_is_taken_over(tmp_path: Path) -> None:
    folder = tmp_path / "cds"
    claim = _claimed(class_archive.archive_options(folder, _SPARK))
    assert claim.is_file(), "the claim is made when the JVM's options are given, before it starts"
    class_archive._pending = None  # another process, while the first still runs: no sharing, no second dump
    assert class_archive.archive_options(folder, _SPARK) == ""

    dead = claim.with_name(claim.name.replace(f".{os.getpid()}.", ".999999999."))
    claim.rename(dead)  # the claimant was killed before its JVM exited
    taken = _claimed(class_archive.archive_options(folder, _SPARK))
    assert taken.is_file() and not dead.exists()
    class_archive.adopt_archive()  # its JVM wrote nothing (stopped by a signal): the empty claim goes
    assert not list(folder.iterdir()) or [p.name for p in folder.iterdir()] == [".lock"]


def test_partial_archives_of_dead_writers_go_and_this_installations_archives_stay(tmp_path: Path) -> None:
    folder = tmp_path / "cds"
    folder.mkdir()
    dead = folder / "spark-0123456789ab-0123456789ab.jsa.999999999.partial"  # no such pid
    alive = folder / f"spark-0123456789ab-0123456789ab.jsa.{os.getpid()}.partial"
    dead.write_bytes(b"x")
    alive.write_bytes(b"x")
    for age, name in enumerate(["a", "b", "c", "d", "e"]):  # other installations' (older clones, venvs)
        stale = folder / f"spark-{name * 12}-{name * 12}.jsa"
        stale.write_bytes(b"x")
        os.utime(stale, (1_000_000 + age, 1_000_000 + age))

    written = _claimed(class_archive.archive_options(folder, _SPARK))
    assert not dead.exists() and alive.exists(), "a live writer's partial archive is its own"
    installation = written.name.split("-")[1]
    own_older = folder / f"spark-{installation}-ffffffffffff.jsa"  # this installation, other jars, oldest of all
    own_older.write_bytes(b"x")
    os.utime(own_older, (1, 1))
    written.write_bytes(b"archive")  # what its JVM writes at exit
    class_archive.adopt_archive()

    kept = {p.name for p in folder.glob("*.jsa")}
    assert kept == {written.name.rsplit(".", 2)[0], own_older.name, "spark-eeeeeeeeeeee-eeeeeeeeeeee.jsa",
                    "spark-dddddddddddd-dddddddddddd.jsa"}
