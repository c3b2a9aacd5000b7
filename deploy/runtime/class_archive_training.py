"""This installation's class-data-sharing archives, written ahead of time by short training runs.

``python -m deploy.runtime.class_archive_training`` is the last step of ``make install``. Without it, the
first Spark JVM of each jar set to exit writes that set's archive (``deploy.runtime.class_archive``): every
driver that starts before then (a fresh ``up``'s three, a test run's first minutes) loads its classes from
the jars, and the writer's exit takes a core for 15-30 s more.

One Spark application per jar set the commands use under the current settings (the storage engine's jars;
the same with Spark's Kafka source, for ``kafka ingest``), each in its own process, loads what the
platform's drivers load: a DataFrame from pandas through Arrow and back, an aggregation over time windows,
a streaming query from a Python data source through ``foreachBatch`` (the speed layer's path), and for the
Kafka set, a Kafka source. Classes none of these load come from the jars as before.

Guarantees: what a JVM runs never changes (an archive only maps classes the JVM would have loaded; see
``class_archive``); an archive in place, or one another process is writing, is left alone; a set that fails
is named, the others are still written, and the exit status is 1 (the platform then runs as without it).
"""

from __future__ import annotations

import logging
import multiprocessing
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit

from deploy.runtime import class_archive
from deploy.settings import load_settings

if TYPE_CHECKING:
    from collections.abc import Iterator

    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

log = logging.getLogger(__name__)


def jar_sets() -> dict[str, tuple[str, ...]]:
    """The Maven packages each kind of driver adds to the engine's: by the name the training reports."""
    from batch_layer.master.kafka_ingest import kafka_package

    return {"batch and speed layers": (), "Kafka ingest": (kafka_package(),)}


def main() -> int:
    """Train one archive per jar set, each in a fresh process (one JVM per process); 1 if any failed."""
    from deploy.runtime import class_archive_training  # the training by its module's name, not __main__'s:
    # a spawned process imports it so, and Spark's Python workers unpickle its data source by that name

    _quiet_logging()
    folder = load_settings().spark_class_archive_dir
    if folder is None:
        log.info("class-data sharing is off (LAMBDA_SPARK_CLASS_ARCHIVE_DIR is empty): no archive to write")
        return 0
    log.info("writing Spark's class-data-sharing archives in %s (once: later Spark JVMs start faster)", folder)
    spawn = multiprocessing.get_context("spawn")  # side by side: a JVM's start and dump use about one core
    training = {name: spawn.Process(target=class_archive_training._train, args=(name, packages))
                for name, packages in jar_sets().items()}
    for process in training.values():
        process.start()
    for process in training.values():
        process.join()
    failed = [name for name, process in training.items() if process.exitcode != 0]
    archives = class_archive.installation_archives(folder)
    log.info("%d archive(s) of this installation in place: %s", len(archives), ", ".join(p.name for p in archives))
    if failed:
        log.error("the training run failed for: %s (see above); an archive written anyway holds only the classes "
                  "loaded before the failure, and Spark JVMs load the others from the jars", ", ".join(failed))
    return 1 if failed else 0


def _quiet_logging() -> None:
    """This module's lines on stderr; others' (py4j's) only from warnings up."""
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    log.setLevel(logging.INFO)


def _train(name: str, packages: tuple[str, ...]) -> None:
    """In a process of its own: start Spark with ``packages``; if its JVM claimed the archive, exercise it;
    stop it, so the JVM writes the archive at exit and it is moved into place."""
    from deploy.runtime.spark import build_spark, stop_spark

    _quiet_logging()
    with tempfile.TemporaryDirectory(prefix="lambda-class-archive-") as scratch:
        settings = load_settings(data_dir=Path(scratch))
        try:
            spark = build_spark(settings, f"class archive: {name}", log_file=Path(scratch) / "spark.log",
                                echo=False, packages=packages)
            if class_archive.claimed():
                _exercise(spark, Path(scratch), kafka=bool(packages))
            else:
                log.info("%s: an archive is in place or being written by another process", name)
        except Exception as e:
            log.error("%s: the training run failed: %s: %s", name, type(e).__name__, e)
            stop_spark()
            sys.exit(1)
        stop_spark()
        log.info("%s: done", name)


def _exercise(spark: SparkSession, scratch: Path, *, kafka: bool) -> None:
    """What the platform's drivers load: the batch layer's kinds of work, the speed layer's streaming query, and
    (``kafka``) the Kafka source's provider and schema."""
    _batch_work(spark, scratch)
    _streaming_work(spark)
    if kafka:
        reader = spark.readStream.format("kafka").option("kafka.bootstrap.servers", "127.0.0.1:9")
        reader.option("subscribe", "class-archive").load().schema  # noqa: B018 - resolving it loads the source


def _batch_work(spark: SparkSession, scratch: Path) -> None:
    """Arrow in and out, parquet written and read, an aggregation over time windows, a join, ``mapInArrow``."""
    import pandas as pd
    from pyspark.sql import functions as F

    events = pd.DataFrame({"key": ["a", "b", "a"], "n": [1, 2, 3],
                           "event_time": pd.to_datetime(["2026-01-01 00:10", "2026-01-01 00:20", "2026-01-01 01:05"])})
    spark.createDataFrame(events).write.parquet(str(scratch / "events"))
    frame = spark.read.parquet(str(scratch / "events")).persist()
    windows = frame.groupBy("key", F.window("event_time", "1 hour")).agg(F.sum("n").alias("n"), F.count("*"))
    joined = windows.join(frame.select("key").distinct(), "key").mapInArrow(lambda batches: batches, windows.schema)
    joined.orderBy("key").toArrow()
    frame.unpersist()


def _streaming_work(spark: SparkSession) -> None:
    """The speed layer's path: a Python data source's Arrow batches, each micro-batch handled in ``foreachBatch``."""
    spark.dataSource.register(_TicksSource)

    def _batch(batch: DataFrame, _: int) -> None:
        batch.groupBy("tick").count().toPandas()

    query = spark.readStream.format(_TicksSource.name()).load().writeStream.foreachBatch(_batch).start()
    query.processAllAvailable()
    query.stop()


class _TicksReader(DataSourceStreamReader):
    """Three rows, then nothing new: ``processAllAvailable`` returns after one micro-batch."""

    def initialOffset(self) -> dict[str, int]:
        return {"tick": 0}

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        return {"tick": 3}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        return [InputPartition((start["tick"], end["tick"]))]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        first, last = partition.value  # as the speed layer's source: Arrow record batches
        yield pa.RecordBatch.from_pydict({"tick": pa.array(range(first, last), pa.int32())})


class _TicksSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "lambda_class_archive_ticks"

    def schema(self) -> str:
        return "tick int"

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return _TicksReader()


if __name__ == "__main__":
    sys.exit(main())
