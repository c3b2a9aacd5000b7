"""Building the SparkSession both layers run on, from settings (never from import-time globals)."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from deploy.settings import Settings


# --- memory: long-running drivers keep a bounded footprint (issue 7 item 14; benchmarks/soak.py measures it) ---
#: Spark keeps status of finished jobs, stages, tasks and SQL executions for its UI even when the UI is off;
#: the defaults (1,000 jobs, 100,000 tasks, 1,000 SQL executions with their plans) grow a streaming driver's
#: live heap for hours. A few recent ones are enough for logs and `lastProgress`.
_MEMORY_CONF = {
    "spark.ui.retainedJobs": "50",
    "spark.ui.retainedStages": "50",
    "spark.ui.retainedTasks": "1000",
    "spark.ui.retainedDeadExecutors": "10",
    "spark.ui.dagGraph.retainedRootRDDs": "50",
    "spark.sql.ui.retainedExecutions": "20",
    "spark.sql.streaming.ui.retainedQueries": "10",
    "spark.sql.streaming.ui.retainedProgressUpdates": "20",
    "spark.sql.streaming.numRecentProgressUpdates": "20",
    # File statuses of the master's files, kept across batch runs: up to 250 MB by default, growing with
    # the file count of an uncompacted master. Re-listing a local table's files is cheap.
    "spark.sql.hive.filesourcePartitionFileCacheSize": str(32 * 1024 * 1024),
    # A full GC every 5 minutes (not 30): cleans up shuffle files and broadcasts of past micro-batches
    # and lets the heap shrink back after a large batch run.
    "spark.cleaner.periodicGC.interval": "5min",
}
#: The serial collector sizes the heap to the live data (G1 grows its young generation towards 60%
#: of -Xmx to meet its pause goal and rarely gives memory back) and has the least native overhead:
#: right for a local driver on a few cores. The heap shrinks after each full GC to at most 40% free.
_DRIVER_JVM_OPTIONS = "-XX:+UseSerialGC -XX:MinHeapFreeRatio=15 -XX:MaxHeapFreeRatio=40 -Xms64m"


def _bound_memory(builder: SparkSession.Builder) -> SparkSession.Builder:
    """Apply the memory settings above; JVM options are appended to those already set."""
    os.environ.setdefault("MALLOC_ARENA_MAX", "2")  # the JVM's and workers' malloc: 2 arenas, not 8 per core
    for key, value in _MEMORY_CONF.items():
        builder = builder.config(key, value)
    options = builder._options.get("spark.driver.extraJavaOptions", "")
    return builder.config("spark.driver.extraJavaOptions", f"{options} {_DRIVER_JVM_OPTIONS}".strip())
# --- end of memory settings ---


def build_spark(settings: Settings, app_name: str = "lambda-platform", *, ui: bool = False) -> SparkSession:
    """A SparkSession for ``settings``: UTC, parquet timestamps as micros, workers on this interpreter.

    Python workers must run the driver's interpreter, or they cannot import the project's packages
    (or a user's pipeline module); both PYSPARK_PYTHON and spark.pyspark.python are set for that.
    """
    from pyspark.sql import SparkSession

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
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.ui.enabled", "true" if ui else "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.extraJavaOptions", "-Dlog4j2.level=WARN")
        .config("spark.local.dir", str(settings.data_dir.resolve() / "spark-tmp"))
    )
    builder = _bound_memory(builder)  # before any operator-given settings, so those win
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark
