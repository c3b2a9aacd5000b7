"""Folding increments into a realtime row, against a plain-Python tally of the same values."""

from __future__ import annotations

import json
import random

import pytest

from speed_layer.realtime_rows import merge

KINDS = ["count", "sum", "min", "max"]


def _tally(batches: list[tuple[list[float], list[str]]]) -> tuple[dict, set[str]]:
    xs = [x for values, _ in batches for x in values]
    return {"count": float(len(xs)), "sum": sum(xs), "min": min(xs), "max": max(xs)}, {
        m for _, members in batches for m in members}


@pytest.mark.parametrize("exact_max", [64, 3, 0])
def test_a_row_folded_micro_batch_by_micro_batch_holds_every_value_once(exact_max: int) -> None:
    rng = random.Random(7)
    batches = [([rng.choice([0.5, 1.25, -3.0, 1e16, 0.1]) for _ in range(rng.randint(1, 4))],
                [f"m{rng.randrange(6)}" for _ in range(rng.randint(0, 3))]) for _ in range(12)]
    row, sketch = None, set()
    for values, members in batches:
        # One increment per value: count 1 and the value itself as its sum, min and max.
        merged = merge(row, KINDS, [["1.0"] * len(values), *([str(v) for v in values] for _ in range(3))],
                       [[members[:1], members[1:]]], exact_max)
        row = merged.row
        sketch.update(merged.sketch_adds[0])
    scores, distinct = _tally(batches)
    parts = json.loads(row)
    assert [float(p) for p in parts[:4]] == pytest.approx([scores[k] for k in KINDS], rel=1e-15)
    if len(distinct) > exact_max:
        assert parts[4] is None and sketch == distinct  # the sketch got every value
    else:
        assert sorted(parts[4]) == sorted(distinct) and not sketch


def test_a_scalar_without_increments_keeps_its_value_and_reports_no_score() -> None:
    first = merge(None, ["sum", "max"], [["2.5"], [None]], [], 64)
    assert json.loads(first.row) == ["2.5", ""] and first.scores == ["2.5", ""]
    second = merge(first.row, ["sum", "max"], [[None], ["4.0"]], [], 64)
    assert json.loads(second.row) == ["2.5", "4.0"] and second.scores == ["", "4.0"]


def test_sums_keep_every_digit() -> None:
    row = merge(None, ["sum"], [["0.1", "0.2"]], [], 64).row
    assert float(json.loads(row)[0]) == 0.1 + 0.2


def test_a_sum_that_overflows_is_kept_as_inf_and_absorbs_what_follows() -> None:
    """Never an error (a micro-batch failing on it would fail on every replay): +inf, whatever the sign, the
    batch part's spelling of an overflow too (``shared_logic.measures.OVERFLOW_PART``)."""
    first = merge(None, ["sum", "max"], [["1.5e308", "1.5e308"], ["1.5e308"]], [], 64)
    assert json.loads(first.row) == ["inf", "1.5e+308"] and first.scores == ["inf", "1.5e+308"]
    assert json.loads(merge(first.row, ["sum", "max"], [["-1e308"], ["2.0"]], [], 64).row)[0] == "inf"
    assert json.loads(merge(None, ["sum"], [["Infinity", "-1.5e308"]], [], 64).row) == ["inf"]  # Spark's spelling
    assert json.loads(merge(None, ["sum"], [["-1.5e308", "-1.5e308"]], [], 64).row) == ["inf"]
    assert json.loads(merge(None, ["sum"], [["inf", "-inf"]], [], 64).row) == ["inf"]  # never NaN


def test_a_session_view_chunk_keeps_its_rows_within_the_bytes_bound() -> None:
    """Session rows are read, merged and written whole: a guarded call carries as many as fit ``CHUNK_BYTES`` at
    their largest (``row_bytes``), never more than ``chunk``; a measure view's calls carry ``chunk``."""
    from datetime import timedelta

    from shared_logic.measures import Count, Max, Min, Sum
    from shared_logic.session_parts import encode_part, part_of_events, row_bytes
    from shared_logic.sessions import SessionWindow
    from speed_layer.segments import CHUNK_BYTES, WriteSpec

    measures = (Count(), Sum("n"), Min("n"), Max("n"))
    big, small = SessionWindow(timedelta(seconds=1), max_sessions=10_000), SessionWindow(timedelta(seconds=1), max_sessions=3)
    spec = WriteSpec("redis://x", "p", "q", "e", 0, 1, (0,), {}, 2_000, sessions={"big": (big, measures), "small": (small, measures)})
    assert spec.chunk_rows("measures") == 2_000 and spec.chunk_rows("small") == 2_000
    assert 1 <= spec.chunk_rows("big") < 2_000 and spec.chunk_rows("big") * row_bytes(big, measures) <= CHUNK_BYTES
    # the estimate holds a full row of large numbers (times near year 9999, 64-bit values)
    events = ((253_402_300_799_000_000 - 2_000_000 * i, {"n": -(2**63) + i}) for i in range(10_000))
    assert len(encode_part(measures, part_of_events(big, measures, events))) <= row_bytes(big, measures)
