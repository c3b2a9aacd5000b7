"""Packages resolved once: the jars the suite's own driver resolved are recorded and handed to the next driver.

The suite's session loaded JVM Delta (resolved by Ivy, or from a record an earlier driver on this machine
wrote); a record names exactly the jars Spark put on that driver (read back from the running JVM), and a record with a jar gone from disk is not used. That a
driver started from a record runs Delta is what every delta-spark subprocess test after the first does.
Drivers started side by side resolve one at a time, under a lock beside the Ivy cache, and the later one starts
from the first one's record.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
from pyspark.sql import SparkSession

from batch_layer.master.delta_spark import delta_spark_conf
from deploy.runtime.resolved_jars import record, resolving, use_recorded


def _asked(ivy: Path) -> dict[str, str]:
    """What a delta-spark driver asks for (the session's own options may already be a record's jars: records
    live beside the machine's shared Ivy cache, so a fresh clone's first driver can start from one)."""
    conf = delta_spark_conf(ivy, snapshot_partitions=2)
    return {"spark.jars.packages": conf["spark.jars.packages"], "spark.jars.excludes": conf["spark.jars.excludes"],
            "spark.jars.ivy": str(ivy), "spark.app.name": "any"}


def test_the_jars_a_driver_resolved_replace_its_packages_next_time(spark: SparkSession, tmp_path: Path) -> None:
    asked = _asked(tmp_path / "ivy")
    resolved = spark.sparkContext.getConf().get("spark.jars").split(",")
    assert any("delta-spark" in jar for jar in resolved)
    assert not use_recorded(dict(asked)), "nothing recorded yet: the driver resolves"

    record(asked, spark)
    options = dict(asked)
    assert use_recorded(options)
    assert options == {"spark.jars": ",".join(resolved), "spark.jars.ivy": str(tmp_path / "ivy"), "spark.app.name": "any"}

    other = {**asked, "spark.jars.excludes": ""}  # another resolution: not this record's
    assert not use_recorded(other) and "spark.jars" not in other


def test_a_record_whose_jar_is_gone_is_not_used(spark: SparkSession, tmp_path: Path) -> None:
    asked = _asked(tmp_path / "ivy")
    record(asked, spark)
    [path] = (tmp_path / "ivy" / "resolved").iterdir()
    gone = tmp_path / "cleaned" / "delta-spark.jar"
    path.write_text(path.read_text() + gone.as_uri() + "\n")
    options = dict(asked)
    assert not use_recorded(options) and options == asked
    assert all(Path(urlparse(j).path).is_file() for j in path.read_text().split()[:-1])


def test_drivers_started_side_by_side_resolve_one_at_a_time_and_the_later_one_uses_the_record(
        spark: SparkSession, tmp_path: Path) -> None:
    """Ivy does not lock its downloads: a driver that resolves holds the cache's lock until it has recorded its
    jars, and a driver that waited for it starts from that record, without Ivy."""
    asked = _asked(tmp_path / "ivy")
    later: dict[str, Any] = {}

    def start_later() -> None:
        options = dict(asked)
        with resolving(options) as resolves:
            later.update(resolves=resolves, options=options, lock_free=_lock_free(tmp_path / "ivy"))

    with resolving(dict(asked)) as resolves:
        assert resolves, "nothing recorded yet: the first driver resolves"
        other = threading.Thread(target=start_later)
        other.start()
        other.join(1.0)
        assert other.is_alive() and not later, "the later driver waits while the first resolves"
        record(asked, spark)
    other.join(30)
    assert later["resolves"] is False, "the later driver found the first one's record"
    assert later["lock_free"], "a driver starting from a record holds no lock through its start"
    assert "spark.jars.packages" not in later["options"] and later["options"]["spark.jars"]


def test_an_ivy_cache_that_cannot_hold_the_lock_resolves_without_it(tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "a-file").write_text("")
    options = _asked(tmp_path / "a-file" / "ivy")  # no folder can be made under a file (root too)
    with caplog.at_level(logging.WARNING), resolving(options) as resolves:
        assert resolves
    assert "without the Ivy cache's lock" in caplog.text and "a-file" in caplog.text


def _lock_free(ivy: Path) -> bool:
    fd = os.open(ivy / ".lambda-resolve.lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
