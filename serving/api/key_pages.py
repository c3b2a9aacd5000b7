"""Pages of a view's keys with their merged values, by an opaque cursor (``GET /v1/views/{view}/keys``).

**Rows.** One row per key: all time, or the panes the request addresses combined (a tumbling view's
window is one pane; a sliding view's window and a ``from``/``to`` or ``last`` range are several), its
value the key route's for those panes (``serving.api.row_values``: each measure's monoid over every
pane's batch and realtime parts, distinct values united).

**Order.** By the encoded key (the string the key route takes, several key columns joined with ``|``),
compared bytewise as UTF-8, which is Unicode code point order. Keys come from the served generation's
key index of each pane (``serving.store.keys``: a sorted set per view and pane, all scores 0, read with
ZRANGEBYLEX, built on first use like the rankings) and from the realtime segment's rows hash of each
pane (a field per realtime row, views without scalar measures included): a segment is small, so all its
keys with the prefix are read and those at or before the cursor dropped here. Each pane gives its first
keys after the cursor; a key is in the page once every pane's keys up to it are known (the least last
key of the panes that may hold more), so a page is a merge of the panes' sorted key lists.

**Cursor.** Keyset pagination: a cursor is the key of the last row a page examined (and the first
pane's start), with a fingerprint of the request's filters (view, prefix, key column filters, panes)
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
The values are the key route's own (``serving.api.row_values``).

**Cost.** A page costs one LIST call per bucket (per pane O(log n + each) for the index, plus the
realtime segment's keys) and the value reads: one READ per bucket with its rows for one pane, one per
key with its panes for several (``serving.api.row_values``). A pane gives at most ``each`` keys a call
(``limit``, fewer over many panes: ``_EACH_BUDGET`` keys a call in all), so a page over many panes may
take several calls. Building a pane's index once per generation is an HSCAN of its rows hash (as a
ranking is). Filters on later key columns are applied here, so a selective one may examine many rows: a
page examines at most ``SCAN_BUDGET`` rows and then answers with what it found (maybe none) and a cursor.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import NoReturn

from serving.api.cursor_body import cursor_fields
from serving.api.errors import BadQueryError, ConflictError, UnavailableError
from serving.api.models import KeyEntry, KeyPage
from serving.api.queries import MAX_KEY_CHARS
from serving.api.row_values import read_rows
from serving.store.keys import decode_key, encode_key, suffix
from serving.store.reader import ServingStore
from serving.store.reads import Generation
from shared_logic.event_values import echo
from shared_logic.views import View

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
#: Rows one page examines at most (a selective filter on a later key column may match few of them).
SCAN_BUDGET = 20_000
#: Batch keys one LIST call asks of all panes together, at most (each pane at least one).
_EACH_BUDGET = 20_000
#: Most rows x panes one page of a listing over several panes reads (a read of each key over every pane: 422
#: above, naming limit and the range); an export's pages hold as many rows as this allows.
MAX_LIST_CELLS = 200_000
#: How often a page is read again when its reads named different versions, before a 503.
_TRIES = 50
#: Longest cursor a page takes, in characters of the urlsafe base64 alphabet (``CURSOR_PATTERN``; 422
#: otherwise). The cursor after a key of n UTF-8 bytes is about 1.8 n + 170 characters: within this limit
#: for every key up to about 9,000 bytes, so for every key the key route reads (``MAX_KEY_CHARS``). A
#: view with longer keys cannot be paged past them; its export (CSV, NDJSON) streams every row.
MAX_CURSOR_CHARS = 16_384
CURSOR_PATTERN = "^[A-Za-z0-9_-]*$"
#: Query parameters of the route itself; any other must name a key column of the view.
FIXED_PARAMS = frozenset({"limit", "cursor", "prefix", "window_start", "window_end", "from", "to", "last"})

#: The last key a page examined (None: before the first key).
Position = bytes | None


@dataclass(frozen=True)
class Listing:
    """What a listing asks for: a view, the panes combined per key (starts; [] for all time) and the filters."""

    view: View
    starts: list[int]
    prefix: str
    columns: dict[str, str]
    #: The time parameters as asked, when resolving them read the clock (``last``, ``window_end=now``, ``-1h``): its
    #: cursors carry the panes the first page resolved, and every later page reuses them instead of reading the
    #: clock again (which past a pane boundary would name other panes). '' for absolute times.
    relative: str = ""

    def over(self, first: int, count: int) -> Listing:
        """This listing over ``count`` panes from ``first`` (a cursor's range)."""
        step = self.view.window.pane_seconds if self.view.window else 0
        return replace(self, starts=[first + i * step for i in range(count)])

    @property
    def panes(self) -> list[str]:
        return [suffix(s) for s in self.starts] or [""]

    @property
    def fingerprint(self) -> str:
        asked: list = [self.view.name, self.prefix, sorted(self.columns.items()), self.starts[:1], len(self.starts)]
        if self.relative:  # the panes are the cursor's: the asked times name them
            asked[3:] = [self.relative, "relative"]
        elif len(self.starts) > 1:  # a row per key, panes combined (cursors of the old row per key and pane differ)
            asked.append("combined")
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


def encode_cursor(listing: Listing, at: bytes, served: Generation) -> str:
    body = {"f": listing.fingerprint, "w": listing.starts[0] if listing.starts else None, "t": 0,
            "k": base64.urlsafe_b64encode(at).decode(), "g": served.generation, "l": served.logic}
    if listing.relative and listing.starts:
        body["n"] = len(listing.starts)
    return base64.urlsafe_b64encode(json.dumps(body, separators=(",", ":")).encode()).decode().rstrip("=")


_UNREADABLE = ("cursor: not a cursor this route made; pass next_cursor of the previous page as is, or leave cursor "
               "out to start from the first key")


@dataclass(frozen=True)
class Cursor:
    """A cursor as read: the key to resume after, the logic and the generation its page was read at, and the
    panes (first start, count) a listing of relative times resolved on its first page."""

    after: Position
    logic: str | None
    generation: int | None
    panes: tuple[int, int] | None = None

    def listing(self, listing: Listing) -> Listing:
        """``listing`` over this cursor's panes, if it carries them."""
        return listing.over(*self.panes) if self.panes else listing


def _other_filters() -> NoReturn:
    raise BadQueryError(
        "cursor: it was made for other filters; repeat the request that returned it (the same view, prefix, key "
        "column filters and window_start, window_end, from/to or last) with only cursor added, or leave cursor "
        "out to start over")


def decode_cursor(listing: Listing, cursor: str | None) -> Cursor:
    """The key after which a cursor resumes, the logic and generation it was made at (None: no cursor);
    422 when it is not exactly what ``encode_cursor`` makes (its fields, their types and values) or was
    made for other filters."""
    if cursor is None:
        return Cursor(None, None, None)
    try:
        fingerprint, window, _, key, generation, logic, panes = cursor_fields(cursor)
    except ValueError as e:
        raise BadQueryError(_UNREADABLE) from e
    if listing.relative and listing.starts and window is not None and panes is not None:
        return Cursor(key, logic, generation, (window, panes)) if fingerprint == listing.fingerprint else \
            _other_filters()
    if fingerprint != listing.fingerprint or window != (listing.starts[0] if listing.starts else None):
        _other_filters()
    return Cursor(key, logic, generation)


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


def _bounds(prefix: bytes, after: Position) -> tuple[bytes, bytes]:
    """ZRANGEBYLEX bounds of the keys after ``after`` with ``prefix``."""
    hi = b"[" + prefix + b"\xff" if prefix else b"+"  # no UTF-8 string holds the byte 0xff
    lo = b"(" + after if after is not None and after >= prefix else b"[" + prefix if prefix else b"-"
    return lo, hi


class _Moved(Exception):
    """The store answered at two versions within one page: read it again."""


def _same(state: Generation | None, seen: Generation) -> Generation:
    if state is not None and (state.generation, state.processed) != (seen.generation, seen.processed):
        raise _Moved
    return seen


async def key_page(store: ServingStore, listing: Listing, after: Position, limit: int) -> tuple[list[KeyEntry], Position, Generation]:
    """The next up to ``limit`` rows after ``after``, with their values, all at one version; and the key
    the next page starts after (None: this was the last page)."""
    for _ in range(_TRIES):
        try:
            return await _page(store, listing, after, limit)
        except _Moved:
            await asyncio.sleep(0.005)
    raise UnavailableError(f"the store kept moving to new versions while a page of {listing.view.name!r} was read "
                           "(flips or micro-batch commits in between); ask again", headers={"Retry-After": "1"})


async def _page(store: ServingStore, listing: Listing, after: Position, limit: int) -> tuple[list[KeyEntry], Position, Generation]:
    view, panes = listing.view, listing.panes
    raw_prefix = listing.key_prefix().encode()
    each = max(1, min(limit, _EACH_BUDGET // len(panes)))
    state: Generation | None = None
    entries: list[KeyEntry] = []
    examined = 0
    while True:
        listings = await asyncio.gather(*(store.list_keys(bucket, view.name, panes, _bounds(raw_prefix, after),
                                                          raw_prefix, each) for bucket in store.keys.all_buckets()))
        rows: set[bytes] = set()
        ends: list[bytes] = []
        for one in listings:
            state = _same(state, one.generation)
            rows.update(k for k in one.listed() if after is None or k > after)
            end = one.complete_to()
            if end is not None:
                ends.append(end)
        covered = min(ends) if ends else None
        ordered = sorted(k for k in rows if covered is None or k <= covered)
        if len(ordered) > limit - len(entries):
            ordered = ordered[:limit - len(entries)]
            covered = ordered[-1]
        kept = [k.decode() for k in ordered if listing.matches(k.decode())]
        seen, found = await read_rows(store, view, listing.starts, kept)
        for generation in seen:
            state = _same(state, generation)
        entries += found
        examined += len(ordered)
        if len(entries) >= limit or covered is None or examined >= SCAN_BUDGET:
            assert state is not None, "a page reads the store before it ends"
            return entries, covered, state
        after = covered


def _rows_a_page(listing: Listing, limit: int) -> int:
    """``limit``, unless a page of it over the listing's panes would read more than ``MAX_LIST_CELLS``: a 422."""
    panes = len(listing.starts)
    if panes > 1 and limit * panes > MAX_LIST_CELLS:
        raise BadQueryError(f"limit={limit} over {panes} panes is {limit * panes} key-panes to read, more than "
                            f"{MAX_LIST_CELLS}: ask a smaller limit (at most {max(1, MAX_LIST_CELLS // panes)}) or "
                            "a shorter range (from/to, last)")
    return limit


async def page_answer(store: ServingStore, listing: Listing, cursor: str | None, limit: int) -> KeyPage:
    read = decode_cursor(listing, cursor)
    listing = read.listing(listing)
    limit = _rows_a_page(listing, limit)
    entries, end, served = await key_page(store, listing, read.after, limit)
    _not_ahead(read, served)
    _same_logic(read.logic, served)
    return KeyPage(view=listing.view.name, keys=entries, generation=served.generation, version=served.version,
                   next_cursor=None if end is None else encode_cursor(listing, end, served))


async def every_page(store: ServingStore, listing: Listing, cursor: str | None) -> AsyncIterator[list[KeyEntry]]:
    """Every page from ``cursor`` on (``MAX_LIMIT`` rows each, each at one version), until the last one.
    The first page is read before this returns, so its errors (a bad cursor, 503) answer the request."""
    read = decode_cursor(listing, cursor)
    listing = read.listing(listing)
    rows = _rows_a_page(listing, min(MAX_LIMIT, max(1, MAX_LIST_CELLS // max(1, len(listing.starts)))))
    entries, after, served = await key_page(store, listing, read.after, rows)
    _not_ahead(read, served)
    _same_logic(read.logic, served)

    async def pages() -> AsyncIterator[list[KeyEntry]]:
        nonlocal entries, after
        yield entries
        while after is not None:
            entries, after, now = await key_page(store, listing, after, rows)
            _same_logic(served.logic, now)  # mid-stream: the stream breaks off instead of mixing two logics
            yield entries

    return pages()
