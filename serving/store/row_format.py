"""What a view row holds in Redis, beside its name (``serving.store.keys``): its parts' order (and where a
measure is in a generation's recorded layout) and when a distinct measure is kept exactly. Writers (batch
publish, speed segments) and readers agree on both here."""

from __future__ import annotations

import functools
import json

from shared_logic.views import View

#: A batch or realtime row keeps its distinct values exactly up to this many; above it, as a HyperLogLog.
EXACT_DISTINCT_MAX = 64


def row_parts(view: View) -> list[str]:
    """The order of a batch row's parts in Redis: scalar measures, then distinct measures."""
    return [m.name for m in (*view.scalar_measures, *view.distinct_measures)]


@functools.lru_cache(maxsize=256)
def positions(layout: bytes) -> dict[str, int]:
    """Measure name -> index in a batch row, from the generation's row layout of the view (JSON list)."""
    return {name: i for i, name in enumerate(json.loads(layout))}


@functools.lru_cache(maxsize=256)
def where(layout: bytes, measures: tuple[str, ...]) -> list[int | None]:
    """Where each of ``measures`` is in a batch row of the layout ``layout`` (None: not in it)."""
    found = positions(layout)
    return [found.get(m) for m in measures]
