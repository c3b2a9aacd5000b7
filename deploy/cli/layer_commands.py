"""The commands that run a layer's work: ``ingest``, ``batch run``, ``batch schedule``, ``speed run``.

Each takes the settings and the parsed arguments and returns an exit status. The Spark commands log
the JVM to ``DATA_DIR/logs/<part>.log`` (the file ``up`` gives that part), so a command's own output
stays readable.
"""

from __future__ import annotations

import argparse
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

from rich.markup import escape
from rich.table import Table

from batch_layer.errors import BatchLayerError
from deploy.cli.exits import EXIT_FAILED, EXIT_OK, report
from deploy.runtime.signals import stop_on_signals
from deploy.settings import Settings
from deploy.supervision.code_watch import EXIT_CODE_CHANGED, CodeWatch
from deploy.terminal import console, out, progress
from shared_logic.errors import SharedLogicError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def _spark(settings: Settings, args: argparse.Namespace, app_name: str, part: str,
           packages: tuple[str, ...] = ()) -> SparkSession:
    """Spark for this command; the JVM's output goes to ``DATA_DIR/logs/<part>.log`` (the file `up` gives that
    part), and to stderr too only with ``--verbose``."""
    from deploy.runtime.spark import build_spark

    log_file = settings.data_dir.resolve() / "logs" / f"{part}.log"
    return build_spark(settings, app_name, log_file=log_file, echo=args.verbose, packages=packages)


def _redis(settings: Settings) -> AbstractContextManager[str]:
    """LAMBDA_REDIS_URL, or the embedded Redis for the block: started unless it runs, stopped after the
    block however it ends (Ctrl-C and SIGTERM too) unless another command still uses it."""
    from deploy.runtime.redis_server import redis_for

    return redis_for(settings.redis_url, settings.data_dir)


def ingest(settings: Settings, args: argparse.Namespace) -> int:
    from batch_layer.master.backfill import backfill
    from batch_layer.master.dataset import MasterDataset
    from batch_layer.master.dead_letters import DeadLetters
    from deploy.cli.backfill_bar import BackfillBar
    from shared_logic.registry import load_pipeline

    pipeline = load_pipeline(settings.pipeline)
    master = MasterDataset.open(settings, pipeline)
    letters = DeadLetters.open(settings, pipeline.name) if args.dead_letters else None
    # delta-spark: files are read, validated and appended by Spark; on object storage delta-rs commits
    # (conditional puts, safe beside the other writers: batch_layer/master/delta_spark.py), so no Spark.
    # With dead letters the files are validated here, in Python, and the engine appends without Spark.
    if settings.storage_engine == "delta-spark" and not settings.tables_on_object_store and letters is None:
        _spark(settings, args, f"lambda-ingest-{settings.pipeline_slug}", "ingest")
    bar = BackfillBar()
    try:
        with bar:
            done = backfill(master, args.files, file_format=args.file_format, progress=bar, dead_letters=letters)
    except (SharedLogicError, BatchLayerError) as e:
        report(e)
        bar.report_failure()
        return EXIT_FAILED
    events = sum(d.events for d in done)
    if len(done) == 1:
        source = escape(str(done[0].source.path))
        console.print(f"[green]ingested {events} events[/] from {source} at master version {done[0].version}")
    else:
        console.print(f"[green]ingested {events} events[/] from {len(done)} files at master versions "
                      f"{done[0].version} to {done[-1].version}")
    dead = sum(d.dead_letters for d in done)
    if dead:
        console.print(f"[yellow]{dead} bad line(s) or row(s) went to the dead letters[/] of pipeline {pipeline.name} "
                      "(`lambda-platform dead-letters list` shows them; fix, then `dead-letters replay`)")
    return EXIT_OK


def batch_run(settings: Settings, args: argparse.Namespace) -> int:
    from deploy.scheduling.scheduler import run_now
    from shared_logic.registry import load_pipeline

    pipeline = load_pipeline(settings.pipeline)
    with _redis(settings) as redis_url, progress(f"batch run of {pipeline.name}"):
        spark = _spark(settings, args, f"lambda-batch-{pipeline.name}", "batch")
        run = run_now(spark, settings, pipeline, redis_url=redis_url)
    if run.status == "skipped":
        console.print(f"[yellow]batch run {run.id} skipped[/]: {escape(run.skip_reason or '')}")
        return EXIT_OK
    if run.status != "succeeded":
        console.print(f"[red]batch run {run.id} {run.status}[/]: {escape(run.error or '')}")
        return EXIT_FAILED
    state = "now served" if run.flipped else "not served: a newer generation already is"
    table = Table(title=f"batch run {run.id}: pipeline {pipeline.name}, generation {run.generation} ({state})")
    table.add_column("view")
    table.add_column("rows", justify="right")
    for name, rows in run.rows.items():
        table.add_row(name, f"{rows:,}")
    out.print(table)
    out.print(_stages_table(run.stages))
    out.print(f"{run.events or 0:,} events recomputed in {run.duration or 0:.1f}s")
    return EXIT_OK


def _stages_table(stages: list[dict[str, str | int | float | None]]) -> Table:
    table = Table(title="stages")
    table.add_column("stage")
    table.add_column("view")
    table.add_column("count", justify="right")
    table.add_column("seconds", justify="right")
    for stage in stages:
        count = "" if stage["count"] is None else f"{stage['count']:,} {stage['unit']}"
        seconds = "" if stage["seconds"] is None else f"{stage['seconds']:.1f}"
        table.add_row(str(stage["name"]), str(stage["view"] or ""), count, seconds)
    return table


def speed_run(settings: Settings, args: argparse.Namespace) -> int:
    from speed_layer.runner import run_speed_layer

    return run_per_pipeline_app(settings, args, "speed", "speed layer", run_speed_layer)


def batch_schedule(settings: Settings, args: argparse.Namespace) -> int:
    from deploy.scheduling.scheduler import parse_schedule, run_scheduler

    for name in settings.pipeline_names:  # a bad schedule stops here, before Spark starts
        parse_schedule(settings.for_pipeline(name).batch_schedule)
    return run_per_pipeline_app(settings, args, "scheduler", "batch scheduler", run_scheduler)


def run_per_pipeline_app(settings: Settings, args: argparse.Namespace, role: str, what: str,
                         loop: Callable[..., None], *, packages: tuple[str, ...] = ()) -> int:
    """Run ``loop(spark, settings, pipeline, redis_url=, stop=)`` for every pipeline, in one Spark
    application (with ``packages``), until a signal or a change of a pipeline's code stops them
    (``deploy.supervision.workers``)."""
    from deploy.supervision.workers import application_name, run_per_pipeline

    with _redis(settings) as redis_url:
        spark = _spark(settings, args, application_name(role, settings), role, packages)
        stop = stop_on_signals()
        watch = watch_code(settings, stop)
        run_per_pipeline(settings, lambda own, pipeline, stop: loop(
            spark, own, pipeline, redis_url=redis_url, stop=stop), stop, what=what)
    return stopped(what, watch)


def watch_code(settings: Settings, stop: threading.Event) -> CodeWatch:
    """Set ``stop`` once a module of one of the settings' pipelines changes on disk (``CodeWatch``)."""
    from shared_logic.registry import load_pipeline

    return CodeWatch([load_pipeline(name) for name in settings.pipeline_names], stop).start()


def stopped(what: str, watch: CodeWatch) -> int:
    """Say why ``what`` stopped; ``EXIT_CODE_CHANGED`` (restart me on the new code) when its pipeline code changed."""
    if watch.changed is None:
        console.print(f"{what} stopped")
        return EXIT_OK
    console.print(f"[yellow]{what} stopped[/]: {watch.changed} changed on disk; start it again to run the new code "
                  "(`up` does)")
    return EXIT_CODE_CHANGED
