"""A tumbling window's start: the one window holding an instant, aligned to the epoch.

Both layers put an event into the window ``[start_of(t), start_of(t) + size)`` and the serving
layer names a window by its start, so an event lands in exactly one window whichever layer
counts it: ``start <= t < start + size`` with ``start`` a multiple of the size, and a start is its
own window's start. That holds before 1970 and for fractional seconds too (floor, not
truncation toward zero). Epochs are Spark's timestamp range (years 1 to 9999), where a double
still holds the fraction of a second.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared_logic.errors import PipelineDefinitionError
from shared_logic.views import TumblingWindow

LAWS_SETTINGS = settings(max_examples=200, deadline=None, database=None)
FIRST, LAST = -62_135_596_800, 253_402_300_800  # 0001-01-01 and 10000-01-01, UTC

SIZES = st.one_of(st.sampled_from([1, 60, 3600, 86_400, 7 * 86_400]), st.integers(1, 10**8))
EPOCHS = st.one_of(
    st.integers(FIRST, LAST - 1),
    st.floats(min_value=FIRST, max_value=LAST, exclude_max=True),
    st.integers(FIRST, LAST - 1).map(lambda s: s - 1e-6),  # just before a whole second
)


@LAWS_SETTINGS
@given(size=SIZES, t=EPOCHS)
def test_an_instant_lies_in_the_window_that_starts_at_start_of(size: int, t: float) -> None:
    window = TumblingWindow(timedelta(seconds=size))
    start = window.start_of(t)
    assert isinstance(start, int)
    assert start <= t < start + size
    assert start % size == 0
    assert window.start_of(start) == start  # idempotent: a start is its own window's start
    assert window.start_of(start + size) == start + size  # and the next window begins right after it


@LAWS_SETTINGS
@given(size=SIZES, k=st.integers(-(10**6), 10**6), offset=st.floats(min_value=0, max_value=1, exclude_max=True))
def test_every_instant_of_a_window_has_the_same_start(size: int, k: int, offset: float) -> None:
    window = TumblingWindow(timedelta(seconds=size))
    t = k * size + offset * size
    if t < (k + 1) * size:  # offset * size may round up to size itself
        assert window.start_of(t) == k * size


@LAWS_SETTINGS
@given(size=st.timedeltas(min_value=timedelta(days=-10**4), max_value=timedelta(days=10**4)))
def test_a_size_is_a_whole_number_of_seconds_of_at_least_one(size: timedelta) -> None:
    micros = size // timedelta(microseconds=1)
    if micros >= 10**6 and micros % 10**6 == 0:
        assert TumblingWindow(size).seconds == micros // 10**6
    else:
        with pytest.raises(PipelineDefinitionError, match="window size must be a whole number of seconds >= 1"):
            TumblingWindow(size)


@pytest.mark.parametrize("size", [timedelta(0), timedelta(seconds=-60), timedelta(milliseconds=500),
                                  timedelta(seconds=1, microseconds=1), timedelta(seconds=59.5)])
def test_the_usual_mistakes_are_refused(size: timedelta) -> None:
    with pytest.raises(PipelineDefinitionError, match=str(size).replace(".", r"\.")):
        TumblingWindow(size)
