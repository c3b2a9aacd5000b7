"""An independent reference computation of the built-in pipelines' views, in plain Python.

Nothing here imports the platform: the semantics are written down from the pipelines'
documentation, and the input is the master dataset as stored (read with ``deltalake``, keeping
only rows with ``_kind == 'event'``), so the oracle sees exactly the events the batch layer saw,
including the event times the platform filled in at ingest.

Semantics:

* wordcount: the words of an event are its ``text`` split on runs of ASCII whitespace
  (``[ \\t\\n\\x0b\\f\\r]+``), empty strings dropped, case kept.
  ``word_counts``: ``{"count": n}`` per word; ``word_counts_per_minute``: the same per 60 s
  tumbling window of ``event_time``.
* payments: per ``user_id``, ``count``, ``sum_amount``, ``min_amount``, ``max_amount``,
  ``distinct_merchant`` (exact number of distinct merchants) and ``avg_amount = sum / count``.
  ``spend_by_user`` is all time; ``spend_by_user_hourly`` the same per 3600 s window.

Windows are ``[start, start + size)`` aligned to the Unix epoch in UTC:
``start = floor(epoch_seconds / size) * size`` (computed exactly, on microseconds).

A view's answer is a dict mapping ``(key, window_start_epoch_or_None)`` to a dict of measures.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import deltalake

#: ASCII whitespace (what Java's ``\\s`` matches); Unicode spaces such as U+00A0 are word characters.
ASCII_WHITESPACE = re.compile(r"[ \t\n\x0b\f\r]+")
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)

Event = dict[str, Any]
#: One row of a view: (key, window start in epoch seconds, or None for an all-time view).
RowKey = tuple[str, int | None]
Measures = dict[str, Any]
ViewTable = dict[RowKey, Measures]

#: Window size in seconds of every built-in view (None: all time).
VIEW_WINDOWS: dict[str, int | None] = {
    "word_counts": None,
    "word_counts_per_minute": 60,
    "spend_by_user": None,
    "spend_by_user_hourly": 3600,
}
PIPELINE_VIEWS: dict[str, tuple[str, ...]] = {
    "wordcount": ("word_counts", "word_counts_per_minute"),
    "payments": ("spend_by_user", "spend_by_user_hourly"),
}
#: Key column of each pipeline's views.
PIPELINE_KEY: dict[str, str] = {"wordcount": "word", "payments": "user_id"}


# ---------------------------------------------------------------------------------------------
# Reading the master dataset
# ---------------------------------------------------------------------------------------------


def read_events(master_path: Path, version: int | None = None) -> list[Event]:
    """Event rows (``_kind == 'event'``) of the master Delta table, optionally as of ``version``."""
    table = deltalake.DeltaTable(str(master_path), version=version).to_pyarrow_table()
    return [{k: v for k, v in row.items() if k != "_kind"} for row in table.to_pylist() if row["_kind"] == "event"]


def barrier_versions(master_path: Path) -> list[int]:
    """Master versions whose commit added barrier rows (``_kind == 'barrier'``), found from the data."""
    latest = deltalake.DeltaTable(str(master_path)).version()
    found, previous = [], 0
    for version in range(latest + 1):
        kinds = deltalake.DeltaTable(str(master_path), version=version).to_pyarrow_table().column("_kind").to_pylist()
        barriers = kinds.count("barrier")
        if barriers > previous:
            found.append(version)
        previous = barriers
    return found


# ---------------------------------------------------------------------------------------------
# Windows and words
# ---------------------------------------------------------------------------------------------


def as_utc(t: datetime) -> datetime:
    return t.replace(tzinfo=timezone.utc) if t.tzinfo is None else t.astimezone(timezone.utc)


def window_start(t: datetime, size: int) -> int:
    """Epoch seconds of the start of the ``size``-second window holding ``t`` (floor, exact)."""
    return ((as_utc(t) - EPOCH) // timedelta(seconds=size)) * size


def words(text: str) -> list[str]:
    """The words of ``text``: split on ASCII whitespace runs, empty strings dropped, case kept."""
    return [w for w in ASCII_WHITESPACE.split(text) if w != ""]


# ---------------------------------------------------------------------------------------------
# Accumulators (one per view row); ``merge`` combines rows, e.g. the windows of a range
# ---------------------------------------------------------------------------------------------


@dataclass
class WordCount:
    count: int = 0

    def merge(self, other: WordCount) -> WordCount:
        return WordCount(self.count + other.count)

    def measures(self) -> Measures:
        return {"count": self.count}


@dataclass
class Spend:
    amounts: list[float] = field(default_factory=list)
    merchants: set[str] = field(default_factory=set)

    def add(self, amount: float, merchant: str) -> None:
        self.amounts.append(float(amount))
        self.merchants.add(merchant)

    def merge(self, other: Spend) -> Spend:
        return Spend([*self.amounts, *other.amounts], self.merchants | other.merchants)

    def measures(self) -> Measures:
        total = math.fsum(self.amounts)
        return {
            "count": len(self.amounts),
            "sum_amount": total,
            "min_amount": min(self.amounts),
            "max_amount": max(self.amounts),
            "distinct_merchant": len(self.merchants),
            "avg_amount": total / len(self.amounts),
        }


#: Per (key, window) row, its accumulator (WordCount or Spend).
Groups = dict[RowKey, Any]


def wordcount_groups(events: Iterable[Event]) -> dict[str, Groups]:
    all_time: Groups = {}
    per_minute: Groups = {}
    for event in events:
        for word in words(event["text"]):
            all_time.setdefault((word, None), WordCount()).count += 1
            if event.get("event_time") is not None:
                row = (word, window_start(event["event_time"], 60))
                per_minute.setdefault(row, WordCount()).count += 1
    return {"word_counts": all_time, "word_counts_per_minute": per_minute}


def payments_groups(events: Iterable[Event]) -> dict[str, Groups]:
    all_time: Groups = {}
    hourly: Groups = {}
    for event in events:
        user = event["user_id"]
        if user is None:
            continue
        all_time.setdefault((user, None), Spend()).add(event["amount"], event["merchant"])
        if event.get("event_time") is not None:
            row = (user, window_start(event["event_time"], 3600))
            hourly.setdefault(row, Spend()).add(event["amount"], event["merchant"])
    return {"spend_by_user": all_time, "spend_by_user_hourly": hourly}


def groups(pipeline: str, events: Iterable[Event]) -> dict[str, Groups]:
    """Per view, the accumulator of every (key, window) row."""
    if pipeline == "wordcount":
        return wordcount_groups(events)
    if pipeline == "payments":
        return payments_groups(events)
    raise ValueError(f"the oracle knows no pipeline {pipeline!r}")


def views(pipeline: str, events: Iterable[Event]) -> dict[str, ViewTable]:
    """Per view, ``(key, window_start or None) -> measures`` over ``events``."""
    return {name: {row: acc.measures() for row, acc in rows.items()} for name, rows in groups(pipeline, events).items()}


def merchant_sets(events: Iterable[Event], size: int | None) -> dict[RowKey, frozenset[str]]:
    """The exact set of merchants per (user, window) row (all time when ``size`` is None)."""
    if size not in (None, 3600):
        raise ValueError("payments views are all time or hourly")
    spends = payments_groups(events)["spend_by_user" if size is None else "spend_by_user_hourly"]
    return {row: frozenset(acc.merchants) for row, acc in spends.items()}


def windows_in_range(size: int, start: datetime, end: datetime) -> list[int]:
    """Starts of the windows overlapping ``[start, end)``: the window holding ``start``, up to ``end``."""
    first = window_start(start, size)
    stop = (as_utc(end) - EPOCH) / timedelta(seconds=1)
    return [s for s in range(first, math.ceil(stop) + size, size) if s < stop]


def combine_range(view_groups: Groups, key: str, starts: Sequence[int]) -> tuple[Measures | None, list[tuple[int, Measures]]]:
    """The combined measures of ``key`` over the windows ``starts`` and each non-empty window's own.

    Returns ``(None, [])`` when the key has no row in any of those windows.
    """
    present = [(s, view_groups[(key, s)]) for s in sorted(starts) if (key, s) in view_groups]
    if not present:
        return None, []
    total = present[0][1]
    for _, acc in present[1:]:
        total = total.merge(acc)
    return total.measures(), [(s, acc.measures()) for s, acc in present]


# ---------------------------------------------------------------------------------------------
# Reproducible random events for the tests (plain data: JSON-ready dicts)
# ---------------------------------------------------------------------------------------------

#: Words with mixed case, punctuation and non-ASCII letters. U+00A0, U+2003 and U+001C are not
#: ASCII whitespace, so the tokens holding them are one word each. No '/' (see the API tests).
WORD_VOCABULARY: tuple[str, ...] = (
    "the", "The", "THE", "fox", "Fox", "fox,", "fox.", "don't", "(lambda)", '"quoted"', "e-mail",
    "a@b", "x|y", "50%", "#tag", "what?", "C++", "...", "--", "naïve", "Café", "café", "über",
    "日本語", "a\u00a0b", "em\u2003space", "x\x1cy", "&amp;", "key=value", "semi;colon",
)
SEPARATORS: tuple[str, ...] = (" ", " ", " ", "  ", "\t", " \t ", "\n", "\r\n", "\x0b", "\f", "\r", "   \t\t")
PAYMENT_USERS: tuple[str, ...] = (
    "alice", "Alice", "bob", "carol smith", "dave@example.com", "émile", "user|7", "50%off", "q?x#y", "zed",
)
#: Relative weights of the users: some pay often, "zed" rarely.
PAYMENT_USER_WEIGHTS: tuple[int, ...] = (30, 5, 20, 10, 10, 8, 6, 4, 4, 1)
MERCHANTS: tuple[str, ...] = (
    "acme", "Acme", "globex", "initech", "umbrella", "hooli", "stark", "wayne", "tyrell", "café", "A&B",
)


def format_time(rng: Any, t: datetime) -> str:
    """``t`` (UTC) as ISO 8601 in one of several equivalent spellings: Z, +00:00, an offset, naive UTC."""
    style = rng.randrange(5)
    if style == 0:
        return t.isoformat().replace("+00:00", "Z")
    if style == 1:
        return t.isoformat()
    if style == 2:
        return t.astimezone(timezone(timedelta(hours=2))).isoformat()
    if style == 3:
        return t.astimezone(timezone(-timedelta(hours=5, minutes=30))).isoformat()
    return t.replace(tzinfo=None).isoformat()


def random_time(rng: Any, start: datetime, seconds: int) -> datetime:
    """A time in ``[start, start + seconds)``; one in five sits on, or 1 µs before, a minute boundary."""
    if rng.random() < 0.2:
        boundary = start + timedelta(minutes=rng.randrange(seconds // 60))
        return boundary - timedelta(microseconds=rng.choice((0, 1)))
    return start + timedelta(microseconds=rng.randrange(seconds * 1_000_000))


def wordcount_events(rng: Any, n: int, start: datetime, *, seconds: int = 5400) -> list[Event]:
    """``n`` lines; ~1 in 5 has no event_time (omitted or null), some are blank or whitespace only."""
    events: list[Event] = []
    for _ in range(n):
        roll = rng.random()
        if roll < 0.03:
            text = ""
        elif roll < 0.06:
            text = "".join(rng.choice(SEPARATORS) for _ in range(rng.randint(1, 4)))
        else:
            parts = [rng.choice(SEPARATORS) if rng.random() < 0.3 else ""]
            for i in range(rng.randint(1, 10)):
                if i:
                    parts.append(rng.choice(SEPARATORS))
                parts.append(rng.choice(WORD_VOCABULARY))
            parts.append(rng.choice(SEPARATORS) if rng.random() < 0.3 else "")
            text = "".join(parts)
        event: Event = {"text": text}
        timing = rng.random()
        if timing < 0.15:
            pass  # no event_time: the platform fills the ingest time
        elif timing < 0.2:
            event["event_time"] = None
        else:
            event["event_time"] = format_time(rng, random_time(rng, start, seconds))
        events.append(event)
    return events


def payments_events(rng: Any, n: int, start: datetime, *, seconds: int = 8 * 3600,
                    users: Sequence[str] = PAYMENT_USERS, weights: Sequence[int] = PAYMENT_USER_WEIGHTS) -> list[Event]:
    """``n`` payments by weighted users at several merchants; amounts as floats, some as JSON ints."""
    events: list[Event] = []
    for _ in range(n):
        kind = rng.random()
        if kind < 0.1:
            amount: float | int = rng.randint(1, 300)
        elif kind < 0.2:
            amount = rng.choice((0.1, 0.2, 0.3, 0.01, 12345.67, 99999.99))
        else:
            amount = round(rng.uniform(0.01, 500), 2)
        event: Event = {
            "user_id": rng.choices(list(users), weights=list(weights))[0],
            "merchant": rng.choice(MERCHANTS),
            "amount": amount,
        }
        if rng.random() < 0.05:
            pass  # no event_time: the platform fills the ingest time
        else:
            event["event_time"] = format_time(rng, random_time(rng, start, seconds))
        events.append(event)
    return events
