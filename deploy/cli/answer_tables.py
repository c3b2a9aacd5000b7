"""The API's view answers as terminal tables (``lambda-platform query``, ``top``, ``keys``; session views too).

Each function takes the JSON the API returned, unchanged, so ``--json`` and the table show the same
answer; numbers are printed as the API gave them (exact integers stay integers).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.markup import escape
from rich.table import Table


def key_table(answer: dict[str, Any]) -> Table:
    """One key: a row per measure; with ``explain`` its batch and realtime parts beside the merged value."""
    title = f"{answer['view']} [bold]{escape(answer['key'])}[/]"
    span = answer.get("window") or answer.get("range")
    if span:
        title += f", {span['start']} .. {span['end']}"
    if answer.get("now"):
        title += f" (now = {answer['now']})"
    explain = answer.get("explain")
    table = Table(title=title, caption=_exact_as_of(answer))
    table.add_column("measure")
    if explain:
        table.add_column("batch", justify="right")
        table.add_column("realtime", justify="right")
    table.add_column("value", justify="right")
    for measure, value in answer["value"].items():
        parts = [_cell(explain["batch"].get(measure)), _cell(explain["realtime"].get(measure))] if explain else []
        table.add_row(measure, *parts, _cell(value))
    return table


def windows_table(answer: dict[str, Any]) -> Table | None:
    """A range answer's panes (a sliding window's too), oldest first, one row each (None when it has none)."""
    windows = answer.get("windows")
    if not windows:
        return None
    measures = list(answer["value"])
    table = Table(title=f"{answer['view']} {escape(answer['key'])}: per pane")
    table.add_column("pane start")
    for measure in measures:
        table.add_column(measure, justify="right")
    for window in windows:
        table.add_row(window["start"], *(_cell(window["value"].get(m)) for m in measures))
    return table


def top_table(answer: dict[str, Any]) -> Table:
    """The ranking, highest first."""
    title = f"top {answer['n']} of {answer['view']} by {answer['measure']}"
    span = answer.get("window") or answer.get("range")
    if span:
        title += f", {span['start']} .. {span['end']}"
    if answer.get("now"):
        title += f" (now = {answer['now']})"
    table = Table(title=title, caption=_exact_as_of(answer))
    table.add_column("#", justify="right")
    table.add_column("key")
    table.add_column(answer["measure"], justify="right")
    for rank, entry in enumerate(answer["top"], start=1):
        table.add_row(str(rank), escape(entry["key"]), _cell(entry["value"]))
    return table


def keys_table(view: str, entries: Sequence[dict[str, Any]]) -> Table:
    """A page of keys with their merged values, in the API's order (by key); a windowed view's rows all combine
    the same panes, named in the title."""
    measures: list[str] = []
    for entry in entries:
        measures.extend(m for m in entry["value"] if m not in measures)
    window = next((entry["window"] for entry in entries if entry.get("window")), None)
    table = Table(title=f"keys of {view}" + (f", panes {window['start']} to {window['end']}" if window else ""))
    table.add_column("key")
    for measure in measures:
        table.add_column(measure, justify="right")
    for entry in entries:
        table.add_row(escape(str(entry["key"])), *(_cell(entry["value"].get(m)) for m in measures))
    return table


def sessions_table(answer: dict[str, Any]) -> Table:
    """A key's sessions in the range, oldest first: start, end, duration and the measures; folded ones under it."""
    measures: list[str] = []
    for session in answer["sessions"]:
        measures.extend(m for m in session["value"] if m not in measures)
    table = Table(title=_session_title(f"{answer['view']} [bold]{escape(answer['key'])}[/]: sessions", answer),
                  caption=_session_caption(answer))
    for column in ("start", "end", "duration s", *measures):
        table.add_column(column, justify="left" if column in ("start", "end") else "right")
    for session in answer["sessions"]:
        table.add_row(session["session_start"], session["session_end"], _cell(session["duration"]),
                      *(_cell(session["value"].get(m)) for m in measures))
    return table


def summary_table(answer: dict[str, Any]) -> Table:
    """A key's session summary: a row per figure."""
    table = Table(title=_session_title(f"{answer['view']} [bold]{escape(answer['key'])}[/]: session summary", answer),
                  caption=_session_caption(answer))
    table.add_column("figure")
    table.add_column("value", justify="right")
    for figure in ("sessions", "total_duration", "mean_duration", "longest", "folded"):
        table.add_row(figure.replace("_", " ") + (" s" if "duration" in figure or figure == "longest" else ""),
                      _cell(answer[figure]))
    return table


def session_top_table(answer: dict[str, Any]) -> Table:
    """The keys ranked by session count or longest session, highest first."""
    by = "sessions" if answer["by"] == "count" else "longest session s"
    table = Table(title=_session_title(f"top {answer['n']} of {answer['view']} by {by}", answer),
                  caption=_session_caption(answer))
    table.add_column("#", justify="right")
    table.add_column("key")
    table.add_column(by, justify="right")
    for rank, entry in enumerate(answer["top"], start=1):
        table.add_row(str(rank), escape(entry["key"]), _cell(entry["value"]))
    return table


def _session_title(title: str, answer: dict[str, Any]) -> str:
    span = answer.get("range")
    return title + (f", {span['start']} .. {span['end']}" if span else ", all time") + \
        (f" (now = {answer['now']})" if answer.get("now") else "")


def _session_caption(answer: dict[str, Any]) -> str:
    if answer["exact"]:
        return _exact_as_of(answer)
    return (f"NOT exact at master version {answer['version']}: sessions folded past the view's max_sessions touch "
            "this range (see folded)")


def _exact_as_of(answer: dict[str, Any]) -> str:
    return f"exact as of master version {answer['version']} (batch generation {answer['generation']})"


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.6g}" if not value.is_integer() else f"{value:,.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    return escape(str(value))
