"""``lambda-platform query | top | keys``: read views from a running API, as tables or as its JSON.

They talk HTTP to the API at LAMBDA_HTTP_HOST:LAMBDA_HTTP_PORT (``--host``/``--port``) with the
key the other commands use, so they see exactly what any API client sees: merged, exact answers,
and the API's own error detail (unknown view, 503 with the reason) when it cannot answer.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from deploy.cli.answer_tables import (
    key_table,
    keys_table,
    session_top_table,
    sessions_table,
    summary_table,
    top_table,
    windows_table,
)
from deploy.cli.api_client import ApiClient
from deploy.errors import UsageError
from deploy.settings import Settings
from deploy.terminal import out

_TIME = "ISO 8601 (2024-03-01T09:00:00Z), epoch seconds, or relative to now: now, now-15m, or -1h written --from=-1h"
_RANGES = (" Windowed views take --window or --window-end (one window; a sliding view's combines its panes; "
           "--window-end now: the window ending now), --from/--to or --last (the panes of a range, combined). Relative "
           "times are resolved by the API against one clock reading, shown as 'now'.")
_SESSIONS = (" Session views: --sessions (query: the key's sessions), --summary (query: their count, total and mean "
             "duration) or --by count|longest (top: keys by session count or longest session), over --from/--to or "
             "--last (sessions overlapping the range) or all time.")


def add_view_commands(sub: argparse._SubParsersAction, http_options: Any) -> None:
    """Register ``query``, ``top`` and ``keys`` on the CLI's subcommands (``http_options`` adds --host/--port)."""
    query = sub.add_parser(
        "query", help="the merged (batch + realtime) measures of one key of a view, from the running API",
        description="GET /v1/views/VIEW/keys/KEY: the key's measures, exact as of the master version shown." + _RANGES
                    + " Each pane's own values are listed too. --explain shows the batch and realtime parts beside "
                    "the merged value." + _SESSIONS)
    query.add_argument("view", help="view name (GET /v1/views lists them)")
    query.add_argument("key", help="key value; the values of a composite key joined with '|'")
    query.add_argument("--explain", action="store_true", help="show the batch and realtime parts")
    shown = query.add_mutually_exclusive_group()
    shown.add_argument("--sessions", action="store_true", help="session views: the key's sessions in the range")
    shown.add_argument("--summary", action="store_true", help="session views: the key's session count and durations")
    _time_options(query)
    _common(query, http_options)
    query.set_defaults(handler=_cmd_query)

    top = sub.add_parser(
        "top", help="the top keys of a view by a measure, from the running API",
        description="GET /v1/views/VIEW/top: the N keys with the highest merged value of a measure, ties "
                    "broken by key, exact as of the master version shown." + _RANGES + _SESSIONS)
    top.add_argument("view", help="view name (GET /v1/views lists them)")
    top.add_argument("-n", type=int, default=10, help="how many keys (1-1000, default 10)")
    top.add_argument("--measure", help="measure to rank by (default: the view's first)")
    top.add_argument("--by", choices=("count", "longest"), help="session views: rank by session count or longest session")
    _time_options(top)
    _common(top, http_options)
    top.set_defaults(handler=_cmd_top)

    keys = sub.add_parser(
        "keys", help="list a view's keys with their merged values, by key, a page at a time",
        description="GET /v1/views/VIEW/keys: keys in key order with their merged values, one row a key. Prints "
                    "one page and the cursor of the next (--cursor); --all follows every cursor. --where "
                    "COLUMN=VALUE filters on a key column of a composite key." + _RANGES)
    keys.add_argument("view", help="view name (GET /v1/views lists them)")
    keys.add_argument("--prefix", help="only keys starting with this text")
    keys.add_argument("--where", action="append", default=[], metavar="COLUMN=VALUE",
                      help="only keys whose key column COLUMN equals VALUE (repeatable)")
    keys.add_argument("--limit", type=int, default=100, help="keys per page (1-1000, default 100)")
    keys.add_argument("--cursor", help="continue after a previous page (its next cursor)")
    keys.add_argument("--all", action="store_true", help="every page, not just the first")
    _time_options(keys)
    _common(keys, http_options)
    keys.set_defaults(handler=_cmd_keys)


def _time_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--window", metavar="TIME", help=f"windowed views: the window whose first pane holds TIME ({_TIME})")
    parser.add_argument("--window-end", metavar="TIME", help=f"windowed views: the window ending at TIME ({_TIME})")
    parser.add_argument("--from", dest="start", metavar="TIME", help=f"windowed views: range start, inclusive ({_TIME})")
    parser.add_argument("--to", dest="end", metavar="TIME", help=f"windowed views: range end, exclusive; default now ({_TIME})")
    parser.add_argument("--last", metavar="DURATION", help="windowed views: the range from now minus DURATION to now "
                                                           "(15m, 1h, 1h30m)")


def _times(args: argparse.Namespace) -> dict[str, Any]:
    return {"window_start": args.window, "window_end": args.window_end, "from": args.start, "to": args.end,
            "last": args.last}


def _common(parser: argparse.ArgumentParser, http_options: Any) -> None:
    http_options(parser, "ask the API at")
    parser.add_argument("--json", action="store_true", help="print the API's answer as it is (JSON)")


def _cmd_query(settings: Settings, args: argparse.Namespace) -> int:
    if args.sessions or args.summary:
        return _cmd_sessions(settings, args)
    params = {**_times(args), "explain": args.explain or None}
    with ApiClient.from_settings(settings) as api:
        answer = api.get(api.view_path(args.view, "keys", args.key), params)
    if args.json:
        out.print_json(json.dumps(answer))
        return 0
    out.print(key_table(answer))
    windows = windows_table(answer)
    if windows is not None:
        out.print(windows)
    return 0


def _cmd_sessions(settings: Settings, args: argparse.Namespace) -> int:
    """``query --sessions`` / ``--summary``: GET .../sessions/keys/KEY or .../sessions/summary/KEY."""
    _session_range_only(args)
    what = "keys" if args.sessions else "summary"
    with ApiClient.from_settings(settings) as api:
        answer = api.get(api.view_path(args.view, "sessions", what, args.key), _range(args))
    if args.json:
        out.print_json(json.dumps(answer))
    else:
        out.print(sessions_table(answer) if args.sessions else summary_table(answer))
    return 0


def _session_top(settings: Settings, args: argparse.Namespace) -> int:
    """``top --by count|longest``: GET .../sessions/top."""
    _session_range_only(args)
    if args.measure:
        raise UsageError("--measure and --by: a session view ranks --by count or longest, not by a measure")
    with ApiClient.from_settings(settings) as api:
        answer = api.get(api.view_path(args.view, "sessions", "top"), {"by": args.by, "n": args.n, **_range(args)})
    if args.json:
        out.print_json(json.dumps(answer))
    else:
        out.print(session_top_table(answer))
    return 0


def _session_range_only(args: argparse.Namespace) -> None:
    if args.window or args.window_end:
        raise UsageError("session views take a range (--from/--to or --last), not --window or --window-end")


def _range(args: argparse.Namespace) -> dict[str, Any]:
    return {"from": args.start, "to": args.end, "last": args.last}


def _cmd_top(settings: Settings, args: argparse.Namespace) -> int:
    if args.by:
        return _session_top(settings, args)
    params = {"n": args.n, "measure": args.measure, **_times(args)}
    with ApiClient.from_settings(settings) as api:
        answer = api.get(api.view_path(args.view, "top"), params)
    if args.json:
        out.print_json(json.dumps(answer))
    else:
        out.print(top_table(answer))
    return 0


def _cmd_keys(settings: Settings, args: argparse.Namespace) -> int:
    filters = dict(_column_filter(text) for text in args.where)
    cursor = args.cursor
    with ApiClient.from_settings(settings) as api:
        while True:
            params = {"prefix": args.prefix, "limit": args.limit, "cursor": cursor, **_times(args), **filters}
            page = api.get(api.view_path(args.view, "keys"), params)
            if args.json:
                out.print_json(json.dumps(page))
            elif page["keys"] or cursor is None:
                out.print(keys_table(args.view, page["keys"]))
            cursor = page.get("next_cursor")
            if cursor is None or not args.all:
                break
    if cursor is not None and not args.json:
        out.print(f"more keys: --cursor {cursor} (or --all)")
    return 0


def _column_filter(text: str) -> tuple[str, str]:
    column, sep, value = text.partition("=")
    if not sep or not column:
        raise UsageError(f"--where {text!r}: write COLUMN=VALUE, e.g. --where origin=JFK")
    return column, value
