"""Paging a listing of relative times (``last=``) goes on over the panes its first page resolved.

Each page resolves the request's times against the clock again (``windows.resolve``); between the pages the
injected clock moves past a pane boundary, so the second request alone names other panes. The cursor carries
the first page's panes and the second page reuses them. Oracle: pandas over the raw events at the committed
version, per key over the first page's panes (``tests.support.trend_panes``' data and layout: its
realtime parts are ranked sorted sets only, no rows a listing reads, so the rows are the batch generation's).
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone

from serving.api import key_pages
from serving.api.windows import TimeParams, resolve
from serving.store.reader import ServingStore
from tests.support.trend_panes import BARRIER, PANE, PROCESSED, T0, VIEW, events_of, publish


class MovingClock:
    def __init__(self, now: datetime) -> None:
        self.at = now

    def now(self) -> datetime:
        return self.at


def test_pages_of_last_go_on_over_the_first_pages_panes_when_the_clock_passes_a_pane_boundary(redis_url: str) -> None:
    events = events_of(seed=7)
    publish(redis_url, events)
    clock = MovingClock(datetime.fromtimestamp(T0 + 8 * PANE + 250, tz=timezone.utc))
    asked = TimeParams(last=timedelta(seconds=3 * PANE))

    def listing() -> key_pages.Listing:
        span = resolve(VIEW, asked, clock, 2000, "LAMBDA_MAX_RANGE_PANES")
        return key_pages.Listing(VIEW, span.panes, "", {}, relative=repr(asked))

    first = listing()

    async def pages() -> list[tuple[str, float]]:
        store = ServingStore(redis_url, "probe")
        try:
            page = await key_pages.page_answer(store, first, None, 10)
            rows = [(e.key, e.value["count"]) for e in page.keys]
            clock.at += timedelta(seconds=PANE)  # past the next pane boundary: `last` now names other panes
            assert listing().starts != first.starts
            while page.next_cursor is not None:
                page = await key_pages.page_answer(store, listing(), page.next_cursor, 10)
                assert page.version == PROCESSED
                rows += [(e.key, e.value["count"]) for e in page.keys]
            return rows
        finally:
            await store.close()

    rows = asyncio.run(pages())
    seen = events[(events.version <= BARRIER) & events.pane.isin(first.starts)]
    want = seen.groupby("k")["x"].count().sort_index()
    assert rows == [(k, float(v)) for k, v in want.items()]
