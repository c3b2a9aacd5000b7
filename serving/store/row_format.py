"""What a view row holds in Redis, beside its name (``serving.store.keys``): its parts' order and when a
distinct measure is kept exactly. Writers (batch publish, speed segments) and readers agree on both here."""

from __future__ import annotations

from shared_logic.views import View

#: A batch or realtime row keeps its distinct values exactly up to this many; above it, as a HyperLogLog.
EXACT_DISTINCT_MAX = 64


def row_parts(view: View) -> list[str]:
    """The order of a batch row's parts in Redis: scalar measures, then distinct measures."""
    return [m.name for m in (*view.scalar_measures, *view.distinct_measures)]
