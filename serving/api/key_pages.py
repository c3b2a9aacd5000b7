"""Pages of a view's keys with their merged values, by an opaque cursor (``GET /v1/views/{view}/keys``).

**Order.** Rows are listed by (window, key): windows oldest first (all-time views have one), and
inside a window by the encoded key (the string the key route takes, several key columns joined
with ``|``), compared bytewise as UTF-8, which is Unicode code point order. Keys come from the
served generation's key index (``serving.store.keys``: a sorted set per view and window, all
scores 0, read with ZRANGEBYLEX, built on first use like the rankings) and from the realtime
segment's rows hash (a field per realtime row, views without scalar measures included): a segment is small, so all its keys with the prefix are read per window and those at or
before the cursor dropped here.

**Cursor.** Keyset pagination: a cursor is the position (window start, key) of the last row a page
examined, with a fingerprint of the request's filters (view, prefix, key column filters, windows)
and the generation it was read at, as urlsafe base64 of JSON. The next page lists the rows
strictly after that position. A cursor made for other filters is refused (422), and so is one
that is not exactly what this route writes (``serving.api.cursor_body``: its fields, their types
and values) or names a generation after the one its next page is read at (generations only move
forward, so no page was read there). A cursor also names the logic its page was computed under
(``shared_logic.logic``): once the view is served under other logic, its rows are another set
(a fixed transform may rename every key), so a cursor of the old logic is refused (409, start
over) rather than continued into the new rows; an export stream stops the same way.

**Guarantee.** Every row that exists when paging begins is listed exactly once, even when a new
generation is published (a flip) or micro-batches commit between pages; rows that appear while
paging are listed if they sort after the cursor. Why: the merged view's rows only grow with the
version it is exact for (views aggregate an append-only master dataset; a new generation covers
everything the old one and its segment did), and versions never go back (``ServingStore``
answers 503 rather than older). Each page lists every row between its cursor and its own end at
its version, so a row that existed at the start is still there when a page's range passes over
it, and ranges never overlap: no row twice, none skipped.

**Consistency.** Every value of a page is read at one (generation, realtime processed version),
exactly like a key read or a top-N: the listing and the value reads (one atomic call each per
bucket) must all name the same pair, else the page is read again; after ``_TRIES`` it is a 503.
The values are the key route's own (``queries.row_value``).

**Cost.** A page costs one LIST call per bucket (O(log n + limit) for the index, plus the realtime
segment's keys of the windows it walks) and one READ per bucket with its rows; building a
window's index once per generation is an HSCAN of its rows hash (as a ranking is). Filters on
later key columns are applied here, so a selective one may examine many rows: a page examines at
most ``SCAN_BUDGET`` rows and then answers with what it found (maybe none) and a cursor.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from serving.api.cursor_body import cursor_fields
from serving.api.errors import BadQueryError, ConflictError, UnavailableError
from serving.api.models import KeyEntry, KeyPage, WindowSpan
from serving.api.queries import MAX_KEY_CHARS, integral_measures, read_items, row_value, span_of
from serving.store.keys import decode_key, encode_key, suffix
from serving.store.reader import ServingStore
from serving.store.reads import Generation, KeyListing
from shared_logic.event_values import echo
from shared_logic.views import View

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
#: Rows one page examines at most (a selective filter on a later key column may match few of them).
SCAN_BUDGET = 20_000
#: How often a page is read again when its reads named different versions, before a 503.
_TRIES = 50
#: Longest cursor a page takes, in characters of the urlsafe base64 alphabet (``CURSOR_PATTERN``; 422
#: otherwise). The cursor after a key of n UTF-8 bytes is about 1.8 n + 170 characters: within this limit
#: for every key up to about 9,000 bytes, so for every key the key route reads (``MAX_KEY_CHARS``). A
#: view with longer keys cannot be paged past them; its export (CSV, NDJSON) streams every row.
MAX_CURSOR_CHARS = 16_384
CURSOR_PATTERN = "^[A-Za-z0-9_-]*$"
#: Query parameters of the route itself; any other must name a key column of the view.
FIXED_PARAMS = frozenset({"limit", "cursor", "prefix", "window_start", "from", "to"})

#: A position in the order (window index, kind, key): kind -1 is before the window's first key, 0 at
#: ``key``, 1 after the window's last key.
Position = tuple[int, int, bytes]
START: Position = (0, -1, b"")


@dataclass(frozen=True)
class Listing:
    """What a listing asks for: a view, its windows (starts; [] for all time) and the filters."""

    view: View
    starts: list[int]
    prefix: str
    columns: dict[str, str]

    @property
    def windows(self) -> list[str]:
        return [suffix(s) for s in self.starts] or [""]

    @property
    def fingerprint(self) -> str:
        asked = [self.view.name, self.prefix, sorted(self.columns.items()), self.starts[:1], len(self.starts)]
        return hashlib.sha256(json.dumps(asked).encode()).hexdigest()[:16]

    def key_prefix(self) -> str:
        """A prefix every listed key has, for Redis to narrow by: the longer of ``prefix`` and what a filter
        on the first key column implies (when the two contradict, ``matches`` refuses every key)."""
        first = self.columns.get(self.view.keys[0])
        narrowed = "" if first is None else encode_key((first, "")) if len(self.view.keys) > 1 else first
        return max(self.prefix, narrowed, key=len)

    def matches(self, key: str) -> bool:
        if not key.startswith(self.prefix):
            return False
        if not self.columns:
            return True
        try:
            values = dict(zip(self.view.keys, decode_key(key, len(self.view.keys))))
        except ValueError:
            return False
        return all(values[name] == wanted for name, wanted in self.columns.items())


def column_filters(view: View, params: list[tuple[str, str]]) -> dict[str, str]:
    """The key column filters among a request's query parameters; 422 for any other unknown parameter."""
    filters: dict[str, str] = {}
    for name, value in params:
        if name in FIXED_PARAMS:
            continue
        if name not in view.keys:
            raise BadQueryError(
                f"unknown query parameter {echo(name)}: besides {sorted(FIXED_PARAMS)}, this route filters by the key "
                f"columns of view {view.name!r}: {list(view.keys)} (e.g. {view.keys[0]}=<value>)")
        if name in filters:
            raise BadQueryError(f"query parameter {name!r} is given twice; a key column filter takes one value")
        if len(value) > MAX_KEY_CHARS:
            raise BadQueryError(f"query parameter {name!r}: {len(value)} characters, more than the {MAX_KEY_CHARS} "
                                "a key column filter takes (as prefix and the key route's key do)")
        filters[name] = value
    return filters


# --------------------------------------------------------------------------------------------
# the cursor


def encode_cursor(listing: Listing, at: Position, served: Generation) -> str:
    window, kind, key = at
    body = {"f": listing.fingerprint, "w": listing.starts[window] if listing.starts else None, "t": kind,
            "k": base64.urlsafe_b64encode(key).decode(), "g": served.generation, "l": served.logic}
    return base64.urlsafe_b64encode(json.dumps(body, separators=(",", ":")).encode()).decode().rstrip("=")


_UNREADABLE = ("cursor: not a cursor this route made; pass next_cursor of the previous page as is, or leave cursor "
               "out to start from the first key")


@dataclass(frozen=True)
class Cursor:
    """A cursor as read: the position to resume after, the logic and the generation its page was read at."""

    after: Position
    logic: str | None
    generation: int | None


def decode_cursor(listing: Listing, cursor: str | None) -> Cursor:
    """The position after which a cursor resumes, the logic and generation it was made at (None: no cursor);
    422 when it is not exactly what ``encode_cursor`` makes (its fields, their types and values) or was
    made for other filters."""
    if cursor is None:
        return Cursor(START, None, None)
    try:
        fingerprint, window, kind, key, generation, logic = cursor_fields(cursor)
    except ValueError as e:
        raise BadQueryError(_UNREADABLE) from e
    starts, index = listing.starts, 0
    if window is not None and starts and listing.view.window:
        index = (window - starts[0]) // listing.view.window.pane_seconds
    fits = not starts if window is None else 0 <= index < len(starts) and starts[index] == window
    if fingerprint != listing.fingerprint or not fits:
        raise BadQueryError(
            "cursor: it was made for other filters; repeat the request that returned it (the same view, prefix, key "
            "column filters and window_start or from/to) with only cursor added, or leave cursor out to start over")
    return Cursor((index, kind, key), logic, generation)


def _not_ahead(cursor: Cursor, served: Generation) -> None:
    """422 for a cursor naming a generation after the one its next page was read at: generations only move
    forward, so no page of this route was read there."""
    if cursor.generation is not None and cursor.generation > served.generation:
        raise BadQueryError(f"cursor: it names generation {cursor.generation}, after the served one "
                            f"({served.generation}), so this route did not make it; pass next_cursor of the previous "
                            "page as is, or leave cursor out to start from the first key")


def _same_logic(logic: str | None, served: Generation) -> None:
    """409 when the rows paged so far were of other logic than ``served``'s (see Cursor above)."""
    if logic is not None and served.logic != logic:
        was, now = logic or "unrecorded", served.logic or "unrecorded"
        raise ConflictError(f"cursor: the view was recomputed under other logic ({was} -> {now}) since paging "
                            "began, so its rows changed; leave cursor out to start over")


# --------------------------------------------------------------------------------------------
# pages


def _bounds(prefix: bytes, after: Position) -> tuple[bytes, bytes, bytes]:
    """ZRANGEBYLEX bounds: in the cursor's window (keys after it), in later windows, and the upper end."""
    rest = b"[" + prefix if prefix else b"-"
    hi = b"[" + prefix + b"\xff" if prefix else b"+"  # no UTF-8 string holds the byte 0xff
    _, kind, key = after
    first = b"(" + key if kind == 0 and key >= prefix else rest
    return first, rest, hi


def _candidates(listing: KeyListing, after: Position, windows: int) -> tuple[list[Position], Position | None]:
    """One bucket's rows after ``after``, and the position up to which (inclusive) they are all its rows
    (None: all of them to the end)."""
    found = {(w.index, 0, k) for w in listing.windows for k in (*w.batch, *w.realtime)}
    rows = sorted(p for p in found if p > after)
    if not listing.windows:
        return rows, None
    last = listing.windows[-1]
    if len(last.batch) >= last.wanted:  # maybe more batch keys after its last one
        return rows, (last.index, 0, last.batch[-1])
    return rows, None if last.index == windows - 1 else (last.index, 1, b"")


class _Moved(Exception):
    """The store answered at two versions within one page: read it again."""


def _same(state: Generation | None, seen: Generation) -> Generation:
    if state is not None and (state.generation, state.processed) != (seen.generation, seen.processed):
        raise _Moved
    return seen


async def key_page(store: ServingStore, listing: Listing, after: Position, limit: int) -> tuple[list[KeyEntry], Position | None, Generation]:
    """The next up to ``limit`` rows after ``after``, with their values, all at one version; and the position
    the next page starts after (None: this was the last page)."""
    for _ in range(_TRIES):
        try:
            return await _page(store, listing, after, limit)
        except _Moved:
            await asyncio.sleep(0.005)
    raise UnavailableError(f"the store kept moving to new versions while a page of {listing.view.name!r} was read "
                           "(flips or micro-batch commits in between); ask again", headers={"Retry-After": "1"})


async def _page(store: ServingStore, listing: Listing, after: Position, limit: int) -> tuple[list[KeyEntry], Position | None, Generation]:
    view, windows = listing.view, listing.windows
    raw_prefix = listing.key_prefix().encode()
    state: Generation | None = None
    entries: list[KeyEntry] = []
    examined = 0
    while True:
        first = after[0] + 1 if after[1] == 1 else after[0]
        if first >= len(windows):
            return entries, None, _stated(state)
        bounds = _bounds(raw_prefix, after if first == after[0] else START)
        listings = await asyncio.gather(*(store.list_keys(bucket, view.name, windows, first, bounds, raw_prefix, limit)
                                          for bucket in store.keys.all_buckets()))
        rows: set[Position] = set()
        ends: list[Position] = []
        for one in listings:
            state = _same(state, one.generation)
            found, end = _candidates(one, after, len(windows))
            rows.update(found)
            if end is not None:
                ends.append(end)
        covered = min(ends) if ends else None
        ordered = sorted(p for p in rows if covered is None or p <= covered)
        if len(ordered) > limit - len(entries):
            ordered = ordered[:limit - len(entries)]
            covered = ordered[-1]
        kept = [p for p in ordered if listing.matches(p[2].decode())]
        state, found_entries = await _values(store, listing, kept, state)
        entries += found_entries
        examined += len(ordered)
        if len(entries) >= limit or covered is None or examined >= SCAN_BUDGET:
            return entries, covered, state
        after = covered


def _stated(state: Generation | None) -> Generation:
    assert state is not None, "a page reads the store before it ends"
    return state


async def _values(store: ServingStore, listing: Listing, rows: list[Position],
                  state: Generation | None) -> tuple[Generation, list[KeyEntry]]:
    """The entries of ``rows`` that hold a value (a realtime row of a micro-batch not yet committed holds
    none), each bucket's rows in one atomic read at the version ``state`` names."""
    view = listing.view
    if not rows:
        return _stated(state), []
    by_bucket: dict[int, list[int]] = {}
    for i, (_, _, raw) in enumerate(rows):
        by_bucket.setdefault(store.keys.bucket_of(raw.decode()), []).append(i)
    items = [(key.decode(), listing.starts[w] if listing.starts else None) for w, _, key in rows]
    reads = await asyncio.gather(*(read_items(store, view, [items[i] for i in group]) for group in by_bucket.values()))
    for read in reads:
        state = _same(state, read.generation)
    served = _stated(state)
    integral = await integral_measures(store, served.generation, view)
    values: dict[int, dict[str, Any] | None] = {}
    for group, read in zip(by_bucket.values(), reads):
        for j, i in enumerate(group):
            values[i] = row_value(view, read, j, integral)
    entries = []
    for i, (key, start) in enumerate(items):
        value = values[i]
        if value is None:
            continue
        entries.append(KeyEntry(
            key=key, value=value,
            columns=dict(zip(view.keys, decode_key(key, len(view.keys)))) if len(view.keys) > 1 else None,
            window=WindowSpan(**span_of(start, view.window.pane_seconds)) if start is not None and view.window else None,
        ))
    return served, entries


async def page_answer(store: ServingStore, listing: Listing, cursor: str | None, limit: int) -> KeyPage:
    read = decode_cursor(listing, cursor)
    entries, end, served = await key_page(store, listing, read.after, limit)
    _not_ahead(read, served)
    _same_logic(read.logic, served)
    return KeyPage(view=listing.view.name, keys=entries, generation=served.generation, version=served.version,
                   next_cursor=None if end is None else encode_cursor(listing, end, served))


async def every_page(store: ServingStore, listing: Listing, cursor: str | None) -> AsyncIterator[list[KeyEntry]]:
    """Every page from ``cursor`` on (``MAX_LIMIT`` rows each, each at one version), until the last one.
    The first page is read before this returns, so its errors (a bad cursor, 503) answer the request."""
    read = decode_cursor(listing, cursor)
    entries, after, served = await key_page(store, listing, read.after, MAX_LIMIT)
    _not_ahead(read, served)
    _same_logic(read.logic, served)

    async def pages() -> AsyncIterator[list[KeyEntry]]:
        nonlocal entries, after
        yield entries
        while after is not None:
            entries, after, now = await key_page(store, listing, after, MAX_LIMIT)
            _same_logic(served.logic, now)  # mid-stream: the stream breaks off instead of mixing two logics
            yield entries

    return pages()
