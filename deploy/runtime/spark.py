"""Building the SparkSession both layers run on, from settings (never from import-time globals)."""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections import deque
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from deploy.data_dir import private_dir
from deploy.runtime.class_archive import adopt_archive, archive_options, archive_path
from deploy.runtime.resolved_jars import record, resolving
from deploy.runtime.shipping import build_bundle, check_executors, check_local_python, pipeline_modules, ship
from deploy.runtime.signals import signals_held
from deploy.terminal import console

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from deploy.settings import Settings

log = logging.getLogger(__name__)


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

#: PySpark records the Python line behind every Column function call (``F.col``, ``F.sum``, ...) for
#: error messages, at five py4j round trips and a stack walk per call. The speed layer builds its
#: micro-batch's plans anew each time, so that cost grows with a pipeline's views and measures: a third
#: of a small payments micro-batch's CPU, nothing measurable for wordcount's (benchmarks/RESULTS.md,
#: "2026-11-29"). Errors still name the failing expression; set it back to "true" in
#: ``LAMBDA_SPARK_CONF`` to see the Python line too.
_CALL_SITES = "spark.python.sql.dataFrameDebugging.enabled"


def build_spark(settings: Settings, app_name: str = "lambda-platform", *, ui: bool = False,
                log_file: Path | None = None, echo: bool = True, packages: tuple[str, ...] = ()) -> SparkSession:
    """A SparkSession for ``settings``: UTC, parquet timestamps as micros, workers on the executor Python.

    ``log_file``: everything the JVM this starts prints (log4j's WARN lines, the JVM's own warnings,
    local Python workers' output) is appended to that file (0600), and shown on stderr only when
    ``echo``; if the JVM does not start, its last lines are shown whatever ``echo`` says. Unset:
    the JVM prints on this process's stderr. A JVM already running in this process is kept as it is.

    Python workers run ``LAMBDA_SPARK_EXECUTOR_PYTHON`` (default: the driver's interpreter), which
    must be the driver's major.minor version (ExecutorPythonError otherwise). On a cluster the
    project's packages and the pipeline's module are shipped to the executors with the job, and a
    start-up check proves the executors can import what they will run (``deploy.runtime.shipping``).
    ``packages``: more Maven packages for this application (Spark's Kafka source), resolved into the
    shared Ivy cache beside the engine's. The Spark UI and the event log follow ``LAMBDA_SPARK_UI*`` / ``LAMBDA_SPARK_EVENT_LOG_DIR``
    (``ui=True`` also turns the UI on); ``LAMBDA_SPARK_CONF`` is applied last.
    """
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    python = executor_python(settings)
    check_local_python(python)
    os.environ.update(settings.object_store_env())  # S3A and local Python workers inherit them
    os.environ["PYSPARK_PYTHON"] = python  # what PySpark's Python functions name as their worker
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master(settings.spark_master)
        .appName(app_name)
        .config("spark.pyspark.python", python)
        .config("spark.pyspark.driver.python", sys.executable)
        .config("spark.driver.memory", settings.spark_driver_memory)
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", str(settings.spark_shuffle_partitions))
        .config("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
        .config("spark.sql.sources.partitionOverwriteMode", "static")
        .config(map=_engine_conf(settings, packages))
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config(_CALL_SITES, "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.extraJavaOptions", "-Dlog4j2.level=WARN")
        .config("spark.local.dir", str(settings.data_dir.resolve() / "spark-tmp"))
    )
    builder = _bound_memory(builder)  # before any operator-given settings, so those win
    for key, value in {**_cluster_conf(settings), **_operator_conf(settings, ui=ui), **settings.spark_conf}.items():
        builder = builder.config(key, str(value).lower() if isinstance(value, bool) else str(value))
    # Only a JVM this call launches gets the archive's options (a running one ignores them, and its claim
    # would block the archive's writing for as long as this process lives).
    launches = SparkContext._gateway is None
    sharing = archive_options(settings.spark_class_archive_dir, builder._options) if launches else ""
    if sharing:
        options = builder._options.get("spark.driver.extraJavaOptions", "")
        builder = builder.config("spark.driver.extraJavaOptions", f"{options} {sharing}".strip())
    asked = dict(builder._options)
    with resolving(builder._options) if launches else nullcontext(False) as resolves:  # recorded: no Ivy
        if log_file is not None:
            _start_jvm(builder, log_file, echo=echo)
        spark = builder.getOrCreate()
        if resolves:
            record(asked, spark)
    spark.sparkContext.setLogLevel("WARN")
    _ship_code(spark, settings, python)
    return spark


def class_archive_path(settings: Settings, packages: tuple[str, ...] = ()) -> Path | None:
    """The class-data-sharing archive ``build_spark(settings, packages=packages)`` maps once it is written (None:
    sharing is off). Its name follows the jars the builder gets: the engine's and ``packages``, then the operator's
    ``LAMBDA_SPARK_CONF`` over them, as in ``build_spark``."""
    if settings.spark_class_archive_dir is None:
        return None
    options = {key: str(value) for key, value in {**_engine_conf(settings, packages), **settings.spark_conf}.items()}
    return archive_path(settings.spark_class_archive_dir, options)


def stop_spark(timeout: float = 60.0) -> None:
    """Stop this process's Spark, if it started one, and wait for its JVM to exit: the JVM's output goes to a
    log file, not to the command's own stdout, so nothing else makes the command outlive it; a cluster then
    lists the application as finished by the time the command returns. A class-data-sharing archive the JVM
    wrote at exit is moved into place (``class_archive.adopt_archive``)."""
    if "pyspark" not in sys.modules:
        return
    from pyspark import SparkContext

    context, gateway = SparkContext._active_spark_context, SparkContext._gateway
    try:
        if context is not None:
            context.stop()
        if gateway is not None:
            # Marks the client disconnected first: a JavaObject collected after the JVM exits then sends
            # nothing, where it would log a Py4JNetworkError traceback on the command's stderr.
            gateway.shutdown()
        process = getattr(gateway, "proc", None)
        if process is not None:
            process.stdin.close()  # the JVM exits when its stdin closes (PySpark's gateway protocol)
            process.wait(timeout)
            adopt_archive()
    except Exception as e:  # exiting either way; say why the JVM may outlive the command
        log.warning("Spark did not stop cleanly: %s", e)


# --- the JVM's output: a log file, and stderr only on request ------------------------------------
def _start_jvm(builder: SparkSession.Builder, log_file: Path, *, echo: bool) -> None:
    """Start this process's Spark JVM with the builder's settings (as ``getOrCreate`` would), its stdout
    and stderr copied line by line to ``log_file`` and, when ``echo``, to stderr. No-op if it runs."""
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    if SparkContext._gateway is not None:
        return
    conf = SparkConf(loadDefaults=False)
    for key, value in builder._options.items():
        conf.set(key, str(value))
    private_dir(log_file.parent)
    read, write = os.pipe()
    recent: deque[bytes] = deque(maxlen=40)
    copier = threading.Thread(target=_copy_lines, args=(read, log_file, echo, recent), name="spark-jvm-output",
                              daemon=True)
    copier.start()
    try:
        # Ctrl-C or SIGTERM while the JVM starts take effect once it has: interrupted, PySpark deletes the
        # folder the JVM writes its port to, and the JVM, failing to, would stay up forever.
        try:
            with signals_held():
                gateway = launch_gateway(conf, popen_kwargs={"stdout": write, "stderr": write})
        finally:
            os.close(write)  # the JVM holds its own copy
    except Exception:  # it did not start (no Java, say): what it said is the explanation
        copier.join(5)
        if not echo:
            for line in list(recent):
                console.out(line.decode(errors="replace").rstrip("\n"), highlight=False)
        raise
    SparkContext._ensure_initialized(gateway=gateway)
    log.info("Spark's own log: %s%s", log_file, "" if echo else " (-v shows it here too)")


def _copy_lines(read: int, log_file: Path, echo: bool, recent: deque[bytes]) -> None:
    """Append each line read from ``read`` to ``log_file`` (and stderr when ``echo``) until the writers close."""
    with os.fdopen(read, "rb") as source, \
            os.fdopen(os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab") as sink:
        for line in source:
            sink.write(line)
            sink.flush()
            recent.append(line)
            if echo:
                console.out(line.decode(errors="replace").rstrip("\n"), highlight=False)


# --- code on the executors (deploy/runtime/shipping.py) ---------------------------------------------------
def executor_python(settings: Settings) -> str:
    """The Python the executors run: LAMBDA_SPARK_EXECUTOR_PYTHON, else the driver's interpreter."""
    return settings.spark_executor_python or sys.executable


def _is_local(settings: Settings) -> bool:
    return settings.spark_master.startswith("local")


def _cluster_conf(settings: Settings) -> dict[str, str]:
    """Spark settings for the executors' environment: a packed environment, when one is given, and on a
    cluster with tables on object storage the LAMBDA_S3_* credentials as the executors' AWS_* variables
    (Spark redacts values of keys matching ``spark.redaction.regex``, "secret" and "access.key" among them,
    in its UI, event log and logs). Executors with their own credentials (an instance role): leave them unset."""
    conf = {"spark.archives": settings.spark_archives} if settings.spark_archives else {}
    if settings.tables_on_object_store and not _is_local(settings):
        conf.update({f"spark.executorEnv.{name}": value for name, value in settings.object_store_env().items()})
    return conf


def _ship_code(spark: SparkSession, settings: Settings, python: str) -> None:
    """Ship the code (LAMBDA_SPARK_SHIP_CODE) and, on a cluster or another Python, check the executors."""
    modules = tuple(dict.fromkeys(m for name in settings.pipeline_names for m in pipeline_modules(name)))
    if settings.spark_ship_code == "always" or (settings.spark_ship_code == "auto" and not _is_local(settings)):
        bundle = build_bundle(modules)
        ship(spark, bundle)
        log.info("shipped %s to the executors (%s)", ", ".join(bundle.names), bundle.path.name)
    if not _is_local(settings) or python != sys.executable:
        for host, version, executable in check_executors(spark, modules):
            log.info("executor Python on %s: %s (%s)", host, version, executable)


# --- what operators see: the Spark UI and the event log -------------------------------------------
def _operator_conf(settings: Settings, *, ui: bool) -> dict[str, str]:
    """The Spark UI (on with LAMBDA_SPARK_UI or ``ui``, at LAMBDA_SPARK_UI_PORT) and the event log."""
    conf = {"spark.ui.enabled": "true" if settings.spark_ui or ui else "false"}
    if settings.spark_ui_port is not None:
        conf["spark.ui.port"] = str(settings.spark_ui_port)
    if settings.spark_event_log_dir:
        conf["spark.eventLog.enabled"] = "true"
        conf["spark.eventLog.dir"] = _event_log_dir(settings.spark_event_log_dir)
    return conf


def _event_log_dir(value: str) -> str:
    """The event log folder as Spark wants it; a local folder is created (Spark refuses a missing one)."""
    parsed = urlparse(value)
    if parsed.scheme not in ("", "file"):
        return value
    folder = Path(parsed.path if parsed.scheme else value).expanduser().resolve()
    folder.mkdir(parents=True, exist_ok=True)
    return folder.as_uri()


def _engine_conf(settings: Settings, packages: tuple[str, ...] = ()) -> dict[str, bool | float | int | str | None]:
    """What the storage engine needs from Spark, and ``packages`` (typed as ``Builder.config(map=...)`` takes it)."""
    from batch_layer.master.engines import engine_spark_conf
    from batch_layer.master.s3a import merge_conf

    conf = engine_spark_conf(settings.storage_engine, ivy_dir=settings.spark_ivy_dir,
                             snapshot_partitions=settings.spark_shuffle_partitions, tables=settings.tables_root)
    if packages:
        conf = merge_conf(conf, {"spark.jars.packages": ",".join(packages)})
        conf.setdefault("spark.jars.ivy", str(settings.spark_ivy_dir.expanduser().resolve()))
    return {**conf}
