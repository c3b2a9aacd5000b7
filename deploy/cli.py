"""lambda-platform: exact merged views from a Spark batch layer and a Spark speed layer.

    lambda-platform ingest FILE...   append event files (JSON Lines, CSV, Parquet; folders) to the master dataset
    lambda-platform batch run        recompute every view and serve it as a new generation
    lambda-platform batch schedule   recompute on a schedule and on request (single-flight)
    lambda-platform speed run        stream new versions into realtime segments, exactly once
    lambda-platform serve            run the HTTP API
    lambda-platform up               everything, supervised: Redis, API, speed layer, scheduler, demo traffic
    lambda-platform status           each part: up or down, versions, lag, last batch run
    lambda-platform query VIEW KEY   a key's merged measures, from the running API (--explain: its parts)
    lambda-platform top VIEW         the top keys of a view by a measure
    lambda-platform keys VIEW        a view's keys and values, by key, paged (--prefix, --where COL=VALUE)
    lambda-platform generate         demo traffic over HTTP

Configuration comes from LAMBDA_* environment variables (see README); the global options below
override them for one command.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING

from rich.markup import escape
from rich.table import Table

from batch_layer.errors import BatchLayerError
from deploy.class_archive import adopt_archive
from deploy.code_watch import EXIT_CODE_CHANGED, CodeWatch
from deploy.console import configure_logging, console, out, progress
from deploy.errors import ApiError, DeployError
from deploy.settings import Settings, load_settings, private_dir, with_api_keys
from deploy.signals import Terminated, stop_on_signals, unwind_on_signals
from deploy.view_commands import add_view_commands
from shared_logic.errors import SharedLogicError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("lambda_platform")

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
#: Commands that only ask (they leave the data dir alone).
_CLIENTS = {"status", "query", "top", "keys"}
#: Commands that do one thing and print its result (the rest run until stopped).
_ONE_SHOT = {"ingest", "batch run", "status", "query", "top", "keys"}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lambda-platform",
        description=__doc__,
        epilog="Every option falls back to its LAMBDA_* environment variable, then to the local default.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--data-dir", type=Path, help="folder for Delta tables, Redis data, logs (LAMBDA_DATA_DIR)")
    parser.add_argument("--pipeline", help="built-in pipeline name or dotted module path (LAMBDA_PIPELINE)")
    parser.add_argument("--redis-url", help="Redis URL; unset: embedded Redis (LAMBDA_REDIS_URL)")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="debug logging, and Spark's own (JVM) log lines on stderr too; without it they go "
                             "only to DATA_DIR/logs/<part>.log")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    ingest = sub.add_parser(
        "ingest", help="append event files (JSON Lines, CSV, Parquet; folders) to the master dataset",
        description="Validate each FILE against the pipeline's event schema and append it in one commit (one "
                    "master version per file, in the order given): all of a file, or nothing of it. A folder "
                    "stands for its .parquet, .csv, .jsonl and .json files, sorted by name (not recursive). The "
                    "format comes from the extension unless --format names it. Every path, CSV header and "
                    "Parquet schema is checked before anything is written; rows are checked file by file. A bad "
                    "line or row: every problem of that file is listed with its line (CSV: the header is line "
                    "1; Parquet: row) and field, nothing of it is written, and the command lists the files "
                    "already committed (do not ingest them again) and those not written, and exits 1. CSV: "
                    "text coerced to the field types; an empty cell is an absent field. Unknown columns are "
                    "errors, as unknown JSON fields are.")
    ingest.add_argument("files", type=Path, nargs="+", metavar="FILE",
                        help="event file or folder: .jsonl/.json (one JSON event per line), .csv (header line), .parquet")
    ingest.add_argument("--format", choices=("jsonl", "csv", "parquet"), dest="file_format",
                        help="read every FILE as this format, whatever its extension")
    ingest.set_defaults(handler=_cmd_ingest)

    batch = sub.add_parser("batch", help="batch-layer commands")
    batch_sub = batch.add_subparsers(dest="batch_command", required=True, metavar="ACTION")
    run = batch_sub.add_parser("run", help="recompute all views now and serve them as a new generation",
                               description="Append a barrier to the master dataset, recompute every view over "
                                           "the snapshot at its version with Spark, write the gold tables, load "
                                           "Redis and flip the served generation. A failed run serves nothing new.")
    run.set_defaults(handler=_cmd_batch_run)
    schedule = batch_sub.add_parser(
        "schedule", help="run recomputes on the schedule (LAMBDA_BATCH_SCHEDULE) and on request, one at a time",
        description="Recompute on an interval ('15m') or cron expression, and whenever POST /v1/batch/runs asks; "
                    "never two runs at once across processes; skipped when the master dataset has not changed.")
    schedule.set_defaults(handler=_cmd_batch_schedule)

    speed = sub.add_parser("speed", help="speed-layer commands")
    speed_sub = speed.add_subparsers(dest="speed_command", required=True, metavar="ACTION")
    speed_run = speed_sub.add_parser(
        "run", help="run the speed layer continuously (Ctrl-C / SIGTERM stops it after the micro-batch in flight)",
        description="Stream the master dataset's new versions through the shared transform and views into "
                    "realtime segments in Redis, exactly once. Resumes from its checkpoint under the data dir.")
    speed_run.set_defaults(handler=_cmd_speed_run)

    serve = sub.add_parser("serve", help="run the HTTP API (FastAPI + uvicorn)")
    _http_options(serve, "bind")
    serve.set_defaults(handler=_cmd_serve)

    up = sub.add_parser("up", help="start the whole platform locally (what `make run` runs)",
                        description="Start the embedded Redis (unless LAMBDA_REDIS_URL is set), the API, the speed "
                                    "layer, the batch scheduler and demo traffic as supervised child processes. A "
                                    "fresh data dir gets sample events and a first recompute. Ctrl-C or SIGTERM "
                                    "stops everything; `up` again on the same data dir resumes with nothing lost.")
    _http_options(up, "bind the API to")
    up.add_argument("--no-generate", action="store_true", help="no demo traffic")
    up.set_defaults(handler=_cmd_up)

    status = sub.add_parser(
        "status", help="each part: up or down, versions, lag, last batch run; exit 1 when not serving",
        description="Show every part of the pipeline's platform as up or down: master dataset, Redis, batch "
                    "layer, speed layer, API, scheduler, last batch run. Exit status 0 when the platform is "
                    "serving (Redis up, a generation published, the API ready for this pipeline), else 1.")
    _http_options(status, "probe the API at")
    status.add_argument("--json", action="store_true", help="print the status as one JSON object")
    status.set_defaults(handler=_cmd_status)

    generate = sub.add_parser("generate", help="demo traffic: post sample events to the API at a steady rate",
                              description="Post events of the pipeline's samples to POST /v1/events until Ctrl-C. "
                                          "Uses the first key with 'ingest' from LAMBDA_API_KEYS, or when that "
                                          "is unset the data dir's local key (DATA_DIR/local_api_key).")
    generate.add_argument("--rate", type=float, help="events per second (LAMBDA_GENERATE_RATE)")
    _http_options(generate, "post to the API at")
    generate.set_defaults(handler=_cmd_generate)
    add_view_commands(sub, _http_options)
    return parser


def _http_options(parser: argparse.ArgumentParser, verb: str) -> None:
    parser.add_argument("--host", help=f"address to {verb} (LAMBDA_HTTP_HOST)")
    parser.add_argument("--port", type=int, help=f"port to {verb} (LAMBDA_HTTP_PORT)")


def _settings(args: argparse.Namespace) -> Settings:
    overrides = {
        "data_dir": args.data_dir, "pipeline": args.pipeline, "redis_url": args.redis_url,
        "http_host": getattr(args, "host", None), "http_port": getattr(args, "port", None),
    }
    return load_settings(**{k: v for k, v in overrides.items() if v is not None})


def _spark(settings: Settings, args: argparse.Namespace, app_name: str, part: str) -> SparkSession:
    """Spark for this command; the JVM's output goes to ``DATA_DIR/logs/<part>.log`` (the file `up` gives that
    part), and to stderr too only with ``--verbose``."""
    from deploy.spark import build_spark

    log_file = settings.data_dir.resolve() / "logs" / f"{part}.log"
    return build_spark(settings, app_name, log_file=log_file, echo=args.verbose)


def _redis(settings: Settings) -> AbstractContextManager[str]:
    """LAMBDA_REDIS_URL, or the embedded Redis for the block: started unless it runs, stopped after the
    block however it ends (Ctrl-C and SIGTERM too) unless another command still uses it."""
    from deploy.redis_server import redis_for

    return redis_for(settings.redis_url, settings.data_dir)


def _cmd_ingest(settings: Settings, args: argparse.Namespace) -> int:
    from batch_layer.master.backfill import backfill
    from batch_layer.master.dataset import MasterDataset
    from deploy.backfill_bar import BackfillBar
    from shared_logic.registry import load_pipeline

    master = MasterDataset.open(settings, load_pipeline(settings.pipeline))
    # delta-spark: files are read, validated and appended by Spark; on object storage delta-rs commits
    # (conditional puts, safe beside the other writers: batch_layer/master/delta_spark.py), so no Spark.
    if settings.storage_engine == "delta-spark" and not settings.tables_on_object_store:
        _spark(settings, args, f"lambda-ingest-{settings.pipeline_slug}", "ingest")
    bar = BackfillBar()
    try:
        with bar:
            done = backfill(master, args.files, file_format=args.file_format, progress=bar)
    except (SharedLogicError, BatchLayerError) as e:
        _report(e)
        bar.report_failure()
        return EXIT_FAILED
    events = sum(d.events for d in done)
    if len(done) == 1:
        source = escape(str(done[0].source.path))
        console.print(f"[green]ingested {events} events[/] from {source} at master version {done[0].version}")
    else:
        console.print(f"[green]ingested {events} events[/] from {len(done)} files at master versions "
                      f"{done[0].version} to {done[-1].version}")
    return EXIT_OK


def _cmd_batch_run(settings: Settings, args: argparse.Namespace) -> int:
    from deploy.scheduler import run_now
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


def _cmd_speed_run(settings: Settings, args: argparse.Namespace) -> int:
    from speed_layer.runner import run_speed_layer

    return _run_per_pipeline(settings, args, "speed", "speed layer", run_speed_layer)


def _serve(settings: Settings, redis_url: str) -> None:
    import uvicorn

    from serving.api.app import create_app
    from serving.api.http_protocol import JsonErrorHttpProtocol

    app = create_app(settings, redis_url=redis_url)
    uvicorn.run(app, host=settings.http_host, port=settings.http_port, log_level="info", access_log=False,
                http=JsonErrorHttpProtocol)  # a URL over uvicorn's limit gets the JSON error shape too


def _cmd_serve(settings: Settings, args: argparse.Namespace) -> int:
    settings, key = with_api_keys(settings)
    if key is not None:
        log.info("API key: the local key in %s (scopes read, ingest, admin); LAMBDA_API_KEYS overrides it",
                 settings.local_api_key_path)
    with _redis(settings) as redis_url:
        _serve(settings, redis_url)
    return EXIT_OK


def _cmd_batch_schedule(settings: Settings, args: argparse.Namespace) -> int:
    from deploy.scheduler import parse_schedule, run_scheduler

    for name in settings.pipeline_names:  # a bad schedule stops here, before Spark starts
        parse_schedule(settings.for_pipeline(name).batch_schedule)
    return _run_per_pipeline(settings, args, "scheduler", "batch scheduler", run_scheduler)


def _run_per_pipeline(settings: Settings, args: argparse.Namespace, role: str, what: str,
                      loop: Callable[..., None]) -> int:
    """Run ``loop(spark, settings, pipeline, redis_url=, stop=)`` for every pipeline, in one Spark
    application, until a signal or a change of a pipeline's code stops them (``deploy.workers``)."""
    from deploy.workers import application_name, run_per_pipeline

    with _redis(settings) as redis_url:
        spark = _spark(settings, args, application_name(role, settings), role)
        stop = stop_on_signals()
        watch = _watch_code(settings, stop)
        run_per_pipeline(settings, lambda own, pipeline, stop: loop(
            spark, own, pipeline, redis_url=redis_url, stop=stop), stop, what=what)
    return _stopped(what, watch)


def _watch_code(settings: Settings, stop: threading.Event) -> CodeWatch:
    from shared_logic.registry import load_pipeline

    return CodeWatch([load_pipeline(name) for name in settings.pipeline_names], stop).start()


def _stopped(what: str, watch: CodeWatch) -> int:
    if watch.changed is None:
        console.print(f"{what} stopped")
        return EXIT_OK
    console.print(f"[yellow]{what} stopped[/]: {watch.changed} changed on disk; start it again to run the new code "
                  "(`up` does)")
    return EXIT_CODE_CHANGED


def _cmd_up(settings: Settings, args: argparse.Namespace) -> int:
    from deploy.launcher import run_platform

    return run_platform(settings, generate_traffic=not args.no_generate, console=out)


def _cmd_status(settings: Settings, args: argparse.Namespace) -> int:
    from deploy.status import platform_status

    settings, _ = with_api_keys(settings, create=False)
    reads = next((k for k, scopes in (settings.api_keys or {}).items() if "read" in scopes), None)
    names = [settings.pipeline] if args.pipeline else list(settings.pipeline_names)  # --pipeline: that one only
    with progress("probing every part"):
        statuses = [platform_status(settings.model_copy(update={"pipeline": name}), reads) for name in names]
    if args.json:
        answer = statuses[0].as_json() if len(statuses) == 1 else {"pipelines": [s.as_json() for s in statuses]}
        out.print_json(json.dumps(answer))
    else:
        for status in statuses:
            out.print(status.table())
    return EXIT_OK if all(status.serving for status in statuses) else EXIT_FAILED


def _cmd_generate(settings: Settings, args: argparse.Namespace) -> int:
    from deploy.generator import generate

    settings, _ = with_api_keys(settings)
    key = next((k for k, scopes in (settings.api_keys or {}).items() if "ingest" in scopes), None)
    stop = stop_on_signals()
    rate = args.rate or settings.generate_rate
    console.print(f"posting {settings.pipeline} events at {rate:g}/s to {settings.api_url}; Ctrl-C stops")
    accepted = generate(settings.pipeline, settings.api_url, key, rate, stop, routes=settings.api_routes)
    console.print(f"{accepted} events accepted")
    return EXIT_OK


def _report(error: Exception) -> None:
    console.print(f"[red]error:[/] {escape(str(error))}")


def _command(args: argparse.Namespace) -> str:
    return " ".join(filter(None, [args.command, getattr(args, "batch_command", None), getattr(args, "speed_command", None)]))


def run(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv``, run the command, and return its exit status (errors are reported, not raised)."""
    args = _parser().parse_args(argv)
    command = _command(args)
    one_shot = command in _ONE_SHOT
    configure_logging(verbose=args.verbose, one_shot=one_shot)
    unwind_on_signals()  # SIGTERM unwinds like Ctrl-C: the cleanups on the way out run
    handler: Callable[[Settings, argparse.Namespace], int] = args.handler
    try:
        settings = _settings(args)
        os.environ.update(settings.object_store_env())  # delta-rs, pyarrow, S3A and Spark's workers read them
        if command not in _CLIENTS:
            private_dir(settings.data_dir)  # 0700 from the start: events, keys and Redis data live here
        return handler(settings, args)
    except ApiError as e:
        _report(e)
        return EXIT_FAILED
    except DeployError as e:
        _report(e)
        return EXIT_USAGE
    except (SharedLogicError, BatchLayerError) as e:
        _report(e)
        return EXIT_FAILED
    except KeyboardInterrupt:
        console.print("interrupted")
        return 130
    except Terminated:
        console.print("terminated")
        return 143
    except Exception as e:
        if args.verbose or not one_shot:
            log.exception("%s failed", command)
        hint = " (-v shows the traceback)" if one_shot and not args.verbose else ""
        _report(Exception(f"{type(e).__name__}: {e}{hint}"))
        return EXIT_FAILED


def _stop_spark(timeout: float = 60.0) -> None:
    """Stop this process's Spark, if it started one, and wait for its JVM to exit: the JVM's output goes to a
    log file, not to the command's own stdout, so nothing else makes the command outlive it; a cluster then
    lists the application as finished by the time the command returns."""
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


def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry point.

    Exits through ``os._exit`` after flushing: a process that read through pyarrow datasets can
    abort at interpreter shutdown (a known arrow/delta-rs fault, exit 134), which would hide the
    command's real exit status.
    """
    code = run(argv)
    _stop_spark()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
