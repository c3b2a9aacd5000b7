"""The values of a key listing's rows (``serving.api.key_pages``): each key's panes combined into one row.

A listed row is a key over the panes the listing addresses (all time: none; a tumbling view's window: its
pane; a sliding view's window or a range: its panes), and its value is the key route's for the same panes
(``queries.merged_value``): every pane's batch and realtime parts combined with each measure's monoid
(``queries.combine``, ``Measure.combine``), distinct counts as the union of the panes' exact sets and
HyperLogLogs (register union, in the read script). So a listing over ``from``/``to`` answers, per key,
what ``GET .../keys/{key}?from=...&to=...`` answers, never a row per key and pane.

**Reads.** One pane (or all time): a bucket's rows in one atomic read, an item each. Several panes: one
read per key with its panes as the items, because a read unites the distinct values of all its items, so
the read that unites one key's panes reads that key alone. A page's reads run concurrently; each names
the generation and realtime version it was read at, and the caller keeps a page only when all agree.
"""

from __future__ import annotations

import asyncio
from typing import Any

from serving.api.models import KeyEntry, WindowSpan
from serving.api.queries import integral_measures, merged_value, read_items, row_value, span_of
from serving.store.keys import decode_key
from serving.store.reader import ServingStore
from serving.store.reads import Generation, KeyRead
from shared_logic.views import View

#: Reads of one key over many panes a page has in flight at most: each is one Lua call over every pane, and a
#: page's thousand at once would queue behind one another in Redis and hold their replies in memory together.
READS_IN_FLIGHT = 8


def covered(view: View, starts: list[int]) -> WindowSpan | None:
    """The span a listing's rows cover: its first pane's start to its last pane's end (None: all time)."""
    if not starts or view.window is None:
        return None
    pane = view.window.pane_seconds
    return WindowSpan(start=span_of(starts[0], pane)["start"], end=span_of(starts[-1], pane)["end"])


async def read_rows(store: ServingStore, view: View, starts: list[int],
                    keys: list[str]) -> tuple[list[Generation], list[KeyEntry]]:
    """The rows of ``keys`` over the panes ``starts`` that hold a value (a realtime row of a micro-batch not
    yet committed holds none), in the order of ``keys``; and the generation each read met."""
    if not keys:
        return [], []
    if len(starts) > 1:
        return await _combined(store, view, starts, keys)
    return await _one_pane(store, view, starts[0] if starts else None, keys)


async def _one_pane(store: ServingStore, view: View, start: int | None,
                    keys: list[str]) -> tuple[list[Generation], list[KeyEntry]]:
    by_bucket: dict[int, list[int]] = {}
    for i, key in enumerate(keys):
        by_bucket.setdefault(store.keys.bucket_of(key), []).append(i)
    reads = await asyncio.gather(*(read_items(store, view, [(keys[i], start) for i in group])
                                   for group in by_bucket.values()))
    integral = await integral_measures(store, reads[0].generation.generation, view)
    values: dict[int, dict[str, Any] | None] = {}
    for group, read in zip(by_bucket.values(), reads):
        for j, i in enumerate(group):
            values[i] = row_value(view, read, j, integral)
    window = covered(view, [start] if start is not None else [])
    return [r.generation for r in reads], [_entry(view, key, values[i], window) for i, key in enumerate(keys)
                                           if values[i] is not None]


async def _combined(store: ServingStore, view: View, starts: list[int],
                    keys: list[str]) -> tuple[list[Generation], list[KeyEntry]]:
    gate = asyncio.Semaphore(READS_IN_FLIGHT)

    async def over_panes(key: str) -> KeyRead:
        async with gate:
            return await read_items(store, view, [(key, s) for s in starts])

    reads: list[KeyRead] = await asyncio.gather(*(over_panes(key) for key in keys))
    integral = await integral_measures(store, reads[0].generation.generation, view)
    window = covered(view, starts)
    entries = []
    for key, read in zip(keys, reads):
        value = merged_value(view, read, integral)
        if value is not None:
            entries.append(_entry(view, key, value, window))
    return [r.generation for r in reads], entries


def _entry(view: View, key: str, value: dict[str, Any] | None, window: WindowSpan | None) -> KeyEntry:
    assert value is not None
    columns = dict(zip(view.keys, decode_key(key, len(view.keys)))) if len(view.keys) > 1 else None
    return KeyEntry(key=key, value=value, columns=columns, window=window)
