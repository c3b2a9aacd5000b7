"""Building the SparkSession both layers run on, from settings (never from import-time globals)."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from deploy.settings import Settings


def build_spark(settings: Settings, app_name: str = "lambda-platform", *, ui: bool = False) -> SparkSession:
    """A SparkSession for ``settings``: UTC, parquet timestamps as micros, workers on this interpreter.

    Python workers must run the driver's interpreter, or they cannot import the project's packages
    (or a user's pipeline module); both PYSPARK_PYTHON and spark.pyspark.python are set for that.
    """
    from pyspark.sql import SparkSession

    from batch_layer.storage import engine_spark_conf

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master(settings.spark_master)
        .appName(app_name)
        .config("spark.pyspark.python", sys.executable)
        .config("spark.driver.memory", settings.spark_driver_memory)
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", str(settings.spark_shuffle_partitions))
        .config("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
        .config("spark.sql.sources.partitionOverwriteMode", "static")
        .config(map=engine_spark_conf(settings.storage_engine, ivy_dir=settings.spark_ivy_dir,
                                      snapshot_partitions=settings.spark_shuffle_partitions))
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.ui.enabled", "true" if ui else "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.extraJavaOptions", "-Dlog4j2.level=WARN")
        .config("spark.local.dir", str(settings.data_dir.resolve() / "spark-tmp"))
    )
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark
