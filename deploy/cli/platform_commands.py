"""The commands that run or ask the platform as a whole: ``serve``, ``up``, ``status``, ``generate``.

Each takes the settings and the parsed arguments and returns an exit status. Without
LAMBDA_API_KEYS they all use the data dir's local key (``deploy.data_dir.with_api_keys``), so
commands started alone accept and send the same key as ``up``.
"""

from __future__ import annotations

import argparse
import json
import logging
import threading
from typing import TYPE_CHECKING

from deploy.cli.exits import EXIT_FAILED, EXIT_OK
from deploy.cli.layer_commands import stopped, watch_code
from deploy.data_dir import with_api_keys
from deploy.runtime.signals import Terminated, stop_on_signals
from deploy.settings import Settings
from deploy.terminal import console, out, progress

if TYPE_CHECKING:
    import uvicorn

log = logging.getLogger("lambda_platform")
#: Seconds a stopping API waits for requests in flight (a stalled export stream) before it closes them: a code
#: change must not leave the old API holding the port, refusing connections, for as long as a client stalls.
_GRACE_SECONDS = 15


def _serve(settings: Settings, redis_url: str) -> int:
    """Serve until a signal, or until a pipeline module changes on disk: the app holds the pipelines it imported
    (their views, their logic), so it stops then (``EXIT_CODE_CHANGED``) and `up` starts it on the new code, as
    it does the speed layer and the scheduler (``deploy.supervision.code_watch``)."""
    import uvicorn

    from serving.api.app import create_app
    from serving.api.http_protocol import JsonErrorHttpProtocol

    app = create_app(settings, redis_url=redis_url)
    # JsonErrorHttpProtocol: a URL over uvicorn's limit gets the JSON error shape too
    server = uvicorn.Server(uvicorn.Config(app, host=settings.http_host, port=settings.http_port, log_level="info",
                                           access_log=False, http=JsonErrorHttpProtocol,
                                           timeout_graceful_shutdown=_GRACE_SECONDS))
    changed = threading.Event()
    watch = watch_code(settings, changed)
    threading.Thread(target=_exit_when, args=(changed, server), name="code-change-exit", daemon=True).start()
    try:
        server.run()  # uvicorn's own SIGINT/SIGTERM handling: a graceful shutdown
    except (KeyboardInterrupt, Terminated):  # uvicorn raises the signal again once shut down: a stop asked, exit 0
        pass
    return stopped("API", watch)


def _exit_when(changed: threading.Event, server: uvicorn.Server) -> None:
    changed.wait()
    server.should_exit = True  # uvicorn's loop looks at it every tick and shuts down gracefully


def serve(settings: Settings, args: argparse.Namespace) -> int:
    from deploy.runtime.redis_server import redis_for

    settings, key = with_api_keys(settings)
    if key is not None:
        log.info("API key: the local key in %s (scopes read, ingest, admin); LAMBDA_API_KEYS overrides it",
                 settings.local_api_key_path)
    with redis_for(settings.redis_url, settings.data_dir) as redis_url:  # embedded unless LAMBDA_REDIS_URL
        return _serve(settings, redis_url)


def up(settings: Settings, args: argparse.Namespace) -> int:
    from deploy.supervision.launcher import run_platform

    return run_platform(settings, generate_traffic=not args.no_generate, console=out)


def status(settings: Settings, args: argparse.Namespace) -> int:
    from deploy.cli.status import platform_status

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


def generate(settings: Settings, args: argparse.Namespace) -> int:
    from deploy.demo.generator import generate as post_events

    settings, _ = with_api_keys(settings)
    key = next((k for k, scopes in (settings.api_keys or {}).items() if "ingest" in scopes), None)
    stop = stop_on_signals()
    rate = args.rate or settings.generate_rate
    console.print(f"posting {settings.pipeline} events at {rate:g}/s to {settings.api_url}; Ctrl-C stops")
    accepted = post_events(settings.pipeline, settings.api_url, key, rate, stop, routes=settings.api_routes)
    console.print(f"{accepted} events accepted")
    return EXIT_OK
