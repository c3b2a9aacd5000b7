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
    lambda-platform dead-letters list    records ingest refused (bad lines, bad Kafka records), newest first
    lambda-platform dead-letters replay  validate them again after a fix; append the valid ones once
    lambda-platform kafka ingest     read Kafka topics into the master datasets, exactly once (kafka feed, kafka broker)

Configuration comes from LAMBDA_* environment variables (see README); the global options below
override them for one command.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from deploy.cli import layer_commands, platform_commands
from deploy.cli.dead_letter_commands import add_dead_letter_commands
from deploy.cli.kafka_commands import add_kafka_commands
from deploy.cli.view_commands import add_view_commands


def build_parser() -> argparse.ArgumentParser:
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
                    "errors, as unknown JSON fields are. With --dead-letters a bad line or row goes to the "
                    "pipeline's dead letters instead and the rest of its file is committed.")
    ingest.add_argument("files", type=Path, nargs="+", metavar="FILE",
                        help="event file or folder: .jsonl/.json (one JSON event per line), .csv (header line), .parquet")
    ingest.add_argument("--format", choices=("jsonl", "csv", "parquet"), dest="file_format",
                        help="read every FILE as this format, whatever its extension")
    ingest.add_argument("--dead-letters", action="store_true",
                        help="commit each file's valid lines or rows and keep every bad one as a dead letter (raw "
                             "text, file, line, field, reason) instead of writing nothing of the file; "
                             "`dead-letters list` shows them, `dead-letters replay` puts them back after a fix")
    ingest.set_defaults(handler=layer_commands.ingest)

    batch = sub.add_parser("batch", help="batch-layer commands")
    batch_sub = batch.add_subparsers(dest="batch_command", required=True, metavar="ACTION")
    run = batch_sub.add_parser("run", help="recompute all views now and serve them as a new generation",
                               description="Append a barrier to the master dataset, recompute every view over "
                                           "the snapshot at its version with Spark, write the gold tables, load "
                                           "Redis and flip the served generation. A failed run serves nothing new.")
    run.set_defaults(handler=layer_commands.batch_run)
    schedule = batch_sub.add_parser(
        "schedule", help="run recomputes on the schedule (LAMBDA_BATCH_SCHEDULE) and on request, one at a time",
        description="Recompute on an interval ('15m') or cron expression, and whenever POST /v1/batch/runs asks; "
                    "never two runs at once across processes; skipped when the master dataset has not changed.")
    schedule.set_defaults(handler=layer_commands.batch_schedule)

    speed = sub.add_parser("speed", help="speed-layer commands")
    speed_sub = speed.add_subparsers(dest="speed_command", required=True, metavar="ACTION")
    speed_run = speed_sub.add_parser(
        "run", help="run the speed layer continuously (Ctrl-C / SIGTERM stops it after the micro-batch in flight)",
        description="Stream the master dataset's new versions through the shared transform and views into "
                    "realtime segments in Redis, exactly once. Resumes from its checkpoint under the data dir.")
    speed_run.set_defaults(handler=layer_commands.speed_run)

    serve = sub.add_parser("serve", help="run the HTTP API (FastAPI + uvicorn)",
                           description="Serve the HTTP API until Ctrl-C or SIGTERM, or until a pipeline's module "
                                       "changes on disk: then it exits with status 75 so that its supervisor (`up`, "
                                       "Kubernetes, compose) starts it on the new code.")
    http_options(serve, "bind")
    serve.set_defaults(handler=platform_commands.serve)

    up = sub.add_parser("up", help="start the whole platform locally (what `make run` runs)",
                        description="Start the embedded Redis (unless LAMBDA_REDIS_URL is set), the API, the speed "
                                    "layer, the batch scheduler and demo traffic as supervised child processes. A "
                                    "fresh data dir gets sample events, and the scheduler's first recompute serves "
                                    "them. An edited pipeline module restarts the parts that run it. Ctrl-C or "
                                    "SIGTERM stops everything; `up` again on the same data dir resumes with nothing "
                                    "lost.")
    http_options(up, "bind the API to")
    up.add_argument("--no-generate", action="store_true", help="no demo traffic")
    up.set_defaults(handler=platform_commands.up)

    status = sub.add_parser(
        "status", help="each part: up or down, versions, lag, last batch run; exit 1 when not serving",
        description="Show every part of the pipeline's platform as up or down: master dataset, Redis, batch "
                    "layer, speed layer, API, scheduler, last batch run. Exit status 0 when the platform is "
                    "serving (Redis up, a generation published, the API ready for this pipeline), else 1.")
    http_options(status, "probe the API at")
    status.add_argument("--json", action="store_true", help="print the status as one JSON object")
    status.set_defaults(handler=platform_commands.status)

    generate = sub.add_parser("generate", help="demo traffic: post sample events to the API at a steady rate",
                              description="Post events of the pipeline's samples to POST /v1/events until Ctrl-C. "
                                          "Uses the first key with 'ingest' from LAMBDA_API_KEYS, or when that "
                                          "is unset the data dir's local key (DATA_DIR/local_api_key).")
    generate.add_argument("--rate", type=float, help="events per second (LAMBDA_GENERATE_RATE)")
    http_options(generate, "post to the API at")
    generate.set_defaults(handler=platform_commands.generate)
    add_view_commands(sub, http_options)
    add_dead_letter_commands(sub)
    add_kafka_commands(sub)
    return parser


def http_options(parser: argparse.ArgumentParser, verb: str) -> None:
    parser.add_argument("--host", help=f"address to {verb} (LAMBDA_HTTP_HOST)")
    parser.add_argument("--port", type=int, help=f"port to {verb} (LAMBDA_HTTP_PORT)")
