"""This installation's class-data-sharing archives, written ahead of time by short training runs.

``python -m deploy.runtime.class_archive_training`` is the last step of ``make install``. Without it, the
first Spark JVM of each jar set to exit writes that set's archive (``deploy.runtime.class_archive``): every
driver that starts before then (a fresh ``up``'s three, a test run's first minutes) loads its classes from
the jars, and the writer's exit takes a core for 15-30 s more.

One Spark application per jar set the commands use under the current settings (the storage engine's jars;
the same with Spark's Kafka source, for ``kafka ingest``), each in its own process, loads what the
platform's drivers load: parquet and Arrow in and out, an aggregation over time windows, a join and
``mapInArrow``; a streaming query from a Python data source through ``foreachBatch`` (the speed layer's
path); JVM Delta and its change feed under delta-spark; and for the Kafka set, a Kafka source's query.
Classes none of these load come from the jars as before.

Guarantees: what a JVM runs never changes (an archive only maps classes the JVM would have loaded; see
``class_archive``). An archive in place is left alone and no JVM is started for it; one another process
is writing is left to it. A training run that fails (Ctrl-C too) gives up its claim and its JVM is killed, so no
archive of a partial run is put in place; the set is named, the others are still written, the exit status
is 1, and the first command of that set to exit normally writes its archive, as without this step.
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
    """Train the archives not in place yet, each in a process of its own (one JVM each), side by side; 1 if any
    of those runs did not put its archive in place."""
    # The training by its module's name, not __main__'s: a spawned process imports it so, and Spark's Python
    # workers unpickle its data source by that name.
    from deploy.runtime import class_archive_training
    from deploy.runtime.spark import class_archive_path

    _quiet_logging()
    settings = load_settings()
    if settings.spark_class_archive_dir is None:
        log.info("class-data sharing is off (LAMBDA_SPARK_CLASS_ARCHIVE_DIR is empty): no archive to write")
        return 0
    sets = jar_sets()
    missing = [name for name, packages in sets.items() if not _in_place(class_archive_path(settings, packages))]
    if not missing:
        log.info("Spark's class-data-sharing archives: in place")
        return 0
    log.info("writing Spark's class-data-sharing archives for: %s (once, a minute or two: later Spark JVMs start "
             "faster)", ", ".join(missing))
    spawn = multiprocessing.get_context("spawn")  # side by side: a JVM's start and dump use about one core each
    training = [spawn.Process(target=class_archive_training._train, args=(name, sets[name])) for name in missing]
    try:
        for process in training:
            process.start()
    finally:
        for process in training:  # on Ctrl-C too: each gives up its claim and stops its JVM
            process.join()
    failed = [name for name, process in zip(missing, training, strict=True) if process.exitcode != 0]
    if failed:
        log.error("no class-data-sharing archive for: %s (see above); their Spark JVMs load classes from the jars, "
                  "and the first to exit normally writes the archive", ", ".join(failed))
    return 1 if failed else 0


def _in_place(archive: Path | None) -> bool:
    return archive is not None and archive.is_file()


def _quiet_logging() -> None:
    """This module's lines on stderr; others' (py4j's) only from warnings up."""
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    log.setLevel(logging.INFO)


def _train(name: str, packages: tuple[str, ...]) -> None:
    """In a process of its own: start Spark with ``packages``, exercise it, stop it, so its JVM writes the archive
    it claimed at exit and it is moved into place. On any failure (Ctrl-C too) the claim is given up and the JVM
    killed before it writes anything: no archive of a partial run is ever put in place. Exits 1 unless this run
    put the archive in place."""
    from deploy.runtime.spark import build_spark, class_archive_path, stop_spark

    _quiet_logging()
    with tempfile.TemporaryDirectory(prefix="lambda-class-archive-") as scratch:
        settings = load_settings(data_dir=Path(scratch))
        try:
            spark = build_spark(settings, f"class archive: {name}", log_file=Path(scratch) / "spark.log", echo=False,
                                packages=packages)  # one at a time into the Ivy cache (resolved_jars.resolving)
            if not class_archive.claimed():  # the folder cannot be written, or another process writes it
                log.error("%s: this run cannot write the archive (see above, or another process is writing it)", name)
                stop_spark()
                sys.exit(1)
            _exercise(spark, Path(scratch), storage_engine=settings.storage_engine, kafka=bool(packages))
            stop_spark(timeout=600)  # the JVM writes ~200 MB at exit: on two busy cores that can take minutes
        except (Exception, KeyboardInterrupt) as e:  # Ctrl-C too, while the JVM starts, works or writes
            class_archive.discard_claim()
            _kill_jvm()
            log.error("%s: the training run failed: %s: %s", name, type(e).__name__, e)
            sys.exit(1)
    archive = class_archive_path(settings, packages)
    if not _in_place(archive):
        log.error("%s: no archive was put in place (%s; see above)", name, archive)
        sys.exit(1)
    log.info("%s: %s written", name, archive)


def _kill_jvm() -> None:
    """SIGKILL this process's Spark JVM, if it started one: nothing is written at its exit."""
    from pyspark import SparkContext

    process = getattr(SparkContext._gateway, "proc", None)
    if process is not None:
        process.kill()
        process.wait(60)


def _exercise(spark: SparkSession, scratch: Path, *, storage_engine: str, kafka: bool) -> None:
    """What the platform's drivers load: the batch layer's kinds of work (JVM Delta's too, under delta-spark),
    the speed layer's streaming query, and (``kafka``) a Kafka source's query."""
    _batch_work(spark, scratch)
    _streaming_work(spark)
    if storage_engine == "delta-spark":
        _delta_work(spark, scratch)
    if kafka:
        _kafka_work(spark)


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


def _delta_work(spark: SparkSession, scratch: Path) -> None:
    """JVM Delta: a table written with its change feed, read whole and as a change-feed stream (the speed layer's
    input under delta-spark)."""
    table = str(scratch / "delta")
    spark.range(3).write.format("delta").option("delta.enableChangeDataFeed", "true").save(table)
    spark.read.format("delta").load(table).count()
    changes = spark.readStream.format("delta").option("readChangeFeed", "true").option("startingVersion", 0).load(table)
    query = changes.writeStream.format("noop").start()
    query.processAllAvailable()
    query.stop()


def _kafka_work(spark: SparkSession) -> None:
    """A Kafka source's query, started against a port nobody listens on: its admin client and consumer set-up
    load, then it fails within seconds (the failure is the expected end)."""
    from pyspark.errors import StreamingQueryException

    reader = spark.readStream.format("kafka").options(**{
        "kafka.bootstrap.servers": "127.0.0.1:9", "subscribe": "class-archive", "kafka.request.timeout.ms": "2000",
        "kafka.default.api.timeout.ms": "3000", "fetchOffset.numRetries": "1"})
    query = reader.load().writeStream.format("noop").start()
    try:
        query.awaitTermination(20)
    except StreamingQueryException:
        pass
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
