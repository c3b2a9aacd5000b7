"""The ``lambda-platform`` entry point: parse, load the settings, run the command, map errors to exit statuses.

``run`` returns the status (errors are reported, not raised); ``main`` exits with it. The commands
are in ``parser.py`` (their help text) and the ``*_commands.py`` modules beside it.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence

from batch_layer.errors import BatchLayerError
from deploy.cli.exits import EXIT_FAILED, EXIT_USAGE, report
from deploy.cli.parser import build_parser
from deploy.data_dir import private_dir
from deploy.errors import ApiError, DeployError
from deploy.runtime.signals import Terminated, unwind_on_signals
from deploy.settings import Settings, load_settings
from deploy.terminal import configure_logging, console
from shared_logic.errors import SharedLogicError

log = logging.getLogger("lambda_platform")

#: Commands that only ask (they leave the data dir alone).
_CLIENTS = {"status", "query", "top", "keys"}
#: Commands that do one thing and print its result (the rest run until stopped).
_ONE_SHOT = {"ingest", "batch run", "status", "query", "top", "keys", "dead-letters list", "dead-letters replay"}


def _settings(args: argparse.Namespace) -> Settings:
    overrides = {
        "data_dir": args.data_dir, "pipeline": args.pipeline, "redis_url": args.redis_url,
        "http_host": getattr(args, "host", None), "http_port": getattr(args, "port", None),
    }
    return load_settings(**{k: v for k, v in overrides.items() if v is not None})


def _command(args: argparse.Namespace) -> str:
    return " ".join(filter(None, [args.command, getattr(args, "batch_command", None), getattr(args, "speed_command", None),
                             getattr(args, "dead_letters_command", None)]))


def run(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv``, run the command, and return its exit status (errors are reported, not raised)."""
    args = build_parser().parse_args(argv)
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
        report(e)
        return EXIT_FAILED
    except DeployError as e:
        report(e)
        return EXIT_USAGE
    except (SharedLogicError, BatchLayerError) as e:
        report(e)
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
        report(Exception(f"{type(e).__name__}: {e}{hint}"))
        return EXIT_FAILED


def main(argv: Sequence[str] | None = None) -> None:
    """Console-script entry point.

    Exits through ``os._exit`` after flushing: a process that read through pyarrow datasets can
    abort at interpreter shutdown (a known arrow/delta-rs fault, exit 134), which would hide the
    command's real exit status.
    """
    from deploy.runtime.spark import stop_spark

    code = run(argv)
    stop_spark()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
