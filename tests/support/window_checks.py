"""Checks over HTTP of a word count's sliding and session views (key ``word``, measure ``Count()``) against the
pandas oracles of ``tests.support.window_oracle``, over the words of the master dataset's events at a version
(split as ``tests.oracle.words`` does, case kept)."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pandas as pd

from tests import oracle
from tests.support import key_url
from tests.support.key_pages import every_page, rows_of
from tests.support.window_oracle import session_top, sessionize, window_top

MICROS = 1_000_000


def word_times(master: Path, version: int, *, lower: bool = False) -> pd.DataFrame:
    """Every word of the master's events at ``version`` (lower-cased if ``lower``) with its event time ``t`` in epoch
    microseconds."""
    rows = [(w, micros(e["event_time"])) for e in oracle.read_events(master, version)
            for w in oracle.words(e["text"].lower() if lower else e["text"])]
    return pd.DataFrame(rows, columns=["word", "t"])


def micros(t: datetime | str) -> int:
    """Epoch microseconds of a datetime (naive: UTC) or an ISO 8601 text."""
    moment = oracle.as_utc(t if isinstance(t, datetime) else datetime.fromisoformat(t.replace("Z", "+00:00")))
    return (moment - oracle.EPOCH) // timedelta(microseconds=1)


def assert_sliding_exact(http: httpx.Client, view: str, words: pd.DataFrame, size: int, slide: int,
                         version: int) -> int:
    """Every window (``size`` seconds, one every ``slide``) holding a word: its key listing, each key's read and
    its top 5 equal the words whose time lies in the window, counted. Returns how many windows were checked."""
    panes = {int(t) // MICROS // slide * slide for t in words.t}
    starts = sorted({pane - k * slide for pane in panes for k in range(size // slide)})
    for start in starts:
        params = {"window_start": str(start)}
        want = dict(window_top(words, "word", "t", start * MICROS, (start + size) * MICROS, "count", len(words)))
        pages = every_page(http, view, params, 500)
        assert all(page["version"] == version for page in pages), (view, params)
        assert {row["key"]: row["value"] for row in rows_of(pages)} == {w: {"count": n} for w, n in want.items()}, (view, params)
        for word, n in want.items():
            body = http.get(key_url(view, word), params=params).json()
            assert body["version"] == version and body["value"] == {"count": n}, (view, word, params, body)
        top = http.get(f"/v1/views/{view}/top", params={**params, "n": 5}).json()
        assert [(e["key"], e["value"]) for e in top["top"]] == list(want.items())[:5], (view, params, top)
    return len(starts)


def assert_sessions_exact(http: httpx.Client, view: str, words: pd.DataFrame, gap: int, version: int) -> int:
    """Every word's sessions (all time and over a range), its summary and the top 5 words by session count and by
    longest session equal the gap sessionization (``gap`` seconds) of its times; nothing folded. Returns how many
    sessions there are."""
    sessions = sessionize(words, "word", gap * MICROS)
    a, b = (int(words.t.quantile(q)) // MICROS for q in (0.3, 0.5))  # a range: sessions overlapping it, whole
    inside = sessions[(sessions.start < b * MICROS) & (sessions.end >= a * MICROS)]
    for word, mine in sessions.groupby("word"):
        keys, summary_of = (f"/v1/views/{view}/sessions/{kind}/{quote(str(word), safe='')}" for kind in ("keys", "summary"))
        body = http.get(keys).json()
        assert body["version"] == version and body["exact"] and body.get("folded") is None, (word, body)
        assert spans(body["sessions"]) == rows(mine), (word, body)
        ranged = http.get(keys, params={"from": str(a), "to": str(b)}).json()
        assert spans(ranged["sessions"]) == rows(inside[inside.word == word]), (word, a, b, ranged)
        summary = http.get(summary_of).json()
        lengths = mine.end - mine.start
        assert (summary["sessions"], summary["total_duration"], summary["longest"], summary["folded"]) == \
            (len(mine), int(lengths.sum()) / MICROS, int(lengths.max()) / MICROS, 0), (word, summary)
    for by in ("count", "longest"):
        for params, among in (({}, sessions), ({"from": str(a), "to": str(b)}, inside)):
            top = http.get(f"/v1/views/{view}/sessions/top", params={**params, "by": by, "n": 5}).json()
            want = session_top(among, "word", by, 5, per_second=MICROS)
            assert [(e["key"], e["value"]) for e in top["top"]] == want, (by, params, top)
    return len(sessions)


def spans(sessions: list[dict[str, Any]]) -> list[tuple[int, int, int]]:
    """Sessions as answered: (start, end in epoch microseconds, count)."""
    return [(micros(s["session_start"]), micros(s["session_end"]), s["value"]["count"]) for s in sessions]


def rows(sessions: pd.DataFrame) -> list[tuple[int, int, int]]:
    """Sessions of the oracle (``sessionize``, times in microseconds) as ``spans`` gives them."""
    return [(int(r.start), int(r.end), int(r.count)) for r in sessions.itertuples()]
