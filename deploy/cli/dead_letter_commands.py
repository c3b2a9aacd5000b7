"""``lambda-platform dead-letters list | replay``: the records a path refused, and putting them back.

Both read the pipeline's dead-letter table directly (``batch_layer.master.dead_letters``; no API, no
Spark). ``replay`` validates the selected letters again with the pipeline's event model as it is
now and appends the valid ones to the master dataset once each
(``batch_layer.master.dead_letter_replay``); letters still invalid are listed and stay.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any

from rich.markup import escape
from rich.prompt import Confirm
from rich.table import Table

from deploy.cli.exits import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from deploy.settings import Settings
from deploy.terminal import console, out

#: Characters of a letter's raw text and reason a table shows (the rest: ``--limit 1`` and the API).
_SHOWN = 80


def add_dead_letter_commands(sub: argparse._SubParsersAction) -> None:
    """Register ``dead-letters list`` and ``dead-letters replay`` on the CLI's subcommands."""
    from batch_layer.master.dead_letters import SOURCES

    letters = sub.add_parser("dead-letters", help="records refused by ingest (bad lines, bad Kafka records): "
                                                  "list them, replay them after a fix")
    actions = letters.add_subparsers(dest="dead_letters_command", required=True, metavar="ACTION")
    listing = actions.add_parser(
        "list", help="the newest dead letters of the pipeline, as a table",
        description="The pipeline's dead letters, newest first: where each came from (file and line, or "
                    "Kafka topic, partition and offset), the field at fault, why, its raw text, and whether "
                    "it was replayed already. GET /v1/dead-letters answers the same over HTTP.")
    _filters(listing, SOURCES)
    listing.add_argument("--limit", type=int, default=20, help="how many letters (default 20)")
    listing.set_defaults(handler=list_letters)

    replay = actions.add_parser(
        "replay", help="validate dead letters again and append the valid ones to the master dataset, once",
        description="After fixing the event model or the data: the selected letters (every one matching all "
                    "options given; none given: every letter) are validated again with the pipeline's event "
                    "model, each letter's raw text as one event (a JSON object, or a CSV record under its "
                    "header). The valid ones are appended to the master dataset in one commit that records "
                    "each letter's id, so a letter is never appended twice (replaying again skips it). "
                    "Letters still invalid are listed with their problems and stay; the exit status is then 1.")
    replay.add_argument("--id", dest="ids", action="append", metavar="ID", help="a letter's id (repeatable)")
    _filters(replay, SOURCES)
    replay.add_argument("--yes", action="store_true", help="replay without asking")
    replay.set_defaults(handler=replay_letters)


def _filters(parser: argparse.ArgumentParser, sources: tuple[str, ...]) -> None:
    parser.add_argument("--source", choices=sources, help="only letters from this source")
    parser.add_argument("--reason", help="only letters whose reason contains this text (any case)")


def _open(settings: Settings) -> tuple[Any, Any]:
    from batch_layer.master.dataset import MasterDataset
    from batch_layer.master.dead_letters import DeadLetters
    from shared_logic.registry import load_pipeline

    pipeline = load_pipeline(settings.pipeline)
    return DeadLetters.open(settings, pipeline.name), MasterDataset.open(settings, pipeline)


def list_letters(settings: Settings, args: argparse.Namespace) -> int:
    from batch_layer.master.dead_letter_replay import replayed_ids

    if args.limit < 1:
        console.print("[red]error:[/] --limit must be 1 or more")
        return EXIT_USAGE
    letters, master = _open(settings)
    page = letters.page(source=args.source, reason=args.reason, limit=args.limit, newest_first=True)
    done = replayed_ids(master, [str(letter["id"]) for letter in page.letters])
    table = Table(title=f"dead letters of pipeline {settings.pipeline}: {len(page.letters)} of {page.total}, "
                        "newest first", expand=True)
    table.add_column("id", overflow="fold", ratio=2, min_width=8)  # all of it: `replay --id` takes it
    table.add_column("dead at (UTC)", overflow="fold", ratio=1, min_width=10)
    for column in ("source", "where", "reason", "raw"):
        table.add_column(column, overflow="fold", ratio=2 if column in ("reason", "raw") else 1, min_width=8)
    table.add_column("replayed", no_wrap=True)
    for letter in page.letters:
        table.add_row(str(letter["id"]), f"{letter['dead_at']:%Y-%m-%d %H:%M:%S}", str(letter["source"]),
                      escape(where(letter, short=True)), escape(_cut(letter["reason"])), escape(_cut(letter["raw"])),
                      "yes" if letter["id"] in done else "")
    if not page.letters:
        out.print(f"no dead letters{' match' if args.source or args.reason else ''} in pipeline {settings.pipeline}")
        return EXIT_OK
    out.print(table)
    return EXIT_OK


def replay_letters(settings: Settings, args: argparse.Namespace) -> int:
    from batch_layer.master.dead_letter_replay import replay, replayed_ids

    letters, master = _open(settings)
    chosen = letters.select(ids=args.ids, source=args.source, reason=args.reason)
    missing = sorted(set(args.ids or ()) - {str(letter["id"]) for letter in chosen})
    if missing:
        console.print(f"[red]error:[/] no dead letter {', '.join(missing)} (with the --source/--reason given); "
                      "`lambda-platform dead-letters list` shows them")
        return EXIT_FAILED
    if not chosen:
        console.print("no dead letters to replay")
        return EXIT_OK
    before = replayed_ids(master, [str(letter["id"]) for letter in chosen])
    what = f"{len(chosen)} dead letter(s)" + (f" ({len(before)} replayed before: skipped)" if before else "")
    if not args.yes:
        if not sys.stdin.isatty():
            console.print(f"[red]error:[/] {what} selected; add --yes to replay them without asking")
            return EXIT_USAGE
        if not Confirm.ask(f"replay {what} into the master dataset of {settings.pipeline}?", console=console):
            console.print("nothing replayed")
            return EXIT_OK
    result = replay(master, chosen)
    if result.replayed:
        console.print(f"[green]replayed {len(result.replayed)} dead letter(s)[/] into the master dataset at version "
                      f"{result.version}")
    if result.already:
        console.print(f"{len(result.already)} replayed before: skipped")
    if result.invalid:
        by_id = {str(letter["id"]): letter for letter in chosen}
        table = Table(title=f"{len(result.invalid)} still invalid (they stay)")
        for column in ("id", "where", "problems"):
            table.add_column(column, overflow="fold")
        for letter_id, problems in result.invalid.items():
            table.add_row(letter_id, escape(where(by_id[letter_id])),
                          escape("; ".join(f"field {p.field!r}: {p.message}" for p in problems)))
        out.print(table)
        return EXIT_FAILED
    return EXIT_OK


def where(letter: Mapping[str, Any], *, short: bool = False) -> str:
    """Where a letter came from: ``file:line`` (``short``: the file's name only), or ``topic[partition]@offset``."""
    if letter.get("file") is not None:
        file = PurePath(str(letter["file"])).name if short else str(letter["file"])
        return f"{file}:{letter['line']}" if letter.get("line") is not None else file
    if letter.get("topic") is not None:
        return f"{letter['topic']}[{letter['partition']}]@{letter['offset']}"
    return ""


def _cut(text: object) -> str:
    value = str(text or "").replace("\n", "⏎")
    return value if len(value) <= _SHOWN else value[:_SHOWN - 1] + "…"
