"""Packages resolved once: the jars the suite's own driver resolved are recorded and handed to the next driver.

The suite's session resolved JVM Delta with Ivy; its record names exactly the jars Spark put on that
driver (read back from the running JVM), and a record with a jar gone from disk is not used. That a
driver started from a record runs Delta is what every delta-spark subprocess test after the first does.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse

from pyspark.sql import SparkSession

from deploy.runtime.resolved_jars import record, use_recorded


def _asked(spark: SparkSession, ivy: Path) -> dict[str, str]:
    conf = spark.sparkContext.getConf()
    return {"spark.jars.packages": conf.get("spark.jars.packages"), "spark.jars.excludes": conf.get("spark.jars.excludes"),
            "spark.jars.ivy": str(ivy), "spark.app.name": "any"}


def test_the_jars_a_driver_resolved_replace_its_packages_next_time(spark: SparkSession, tmp_path: Path) -> None:
    asked = _asked(spark, tmp_path / "ivy")
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
    asked = _asked(spark, tmp_path / "ivy")
    record(asked, spark)
    [path] = (tmp_path / "ivy" / "resolved").iterdir()
    gone = tmp_path / "cleaned" / "delta-spark.jar"
    path.write_text(path.read_text() + gone.as_uri() + "\n")
    options = dict(asked)
    assert not use_recorded(options) and options == asked
    assert all(Path(urlparse(j).path).is_file() for j in path.read_text().split()[:-1])
