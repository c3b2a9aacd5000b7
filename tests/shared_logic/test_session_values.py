"""What a session view keeps per session, value by value: an integer sum exact whatever the split (and
``OVERFLOW`` only past 64 bits), a measure's own per-event part or a refusal, inputs JSON would not give back
exactly refused with the fix named, and event times from year 1 to 9999 as plain integers. Pure: no Spark."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, ClassVar

import pytest
from pyspark.sql import Column
from pyspark.sql import functions as F

from shared_logic.errors import PipelineDefinitionError
from shared_logic.event_values import EPOCH
from shared_logic.measures import OVERFLOW, Count, Max, Measure, Min, Sum
from shared_logic.session_parts import answer_values, check_session_inputs, decode_part, encode_part, part_of_events
from shared_logic.sessions import Part, SessionWindow, merge_parts
from shared_logic.views import View

WINDOW = SessionWindow(timedelta(seconds=10))
SUM = (Sum("n"),)


def stored(measures: tuple[Measure, ...], part: Part) -> Part:
    return decode_part(measures, encode_part(measures, part))


def sum_of(values: list[int], cut: int) -> Any:
    """The sum of ``values`` (one session) merged from two stored parts split at ``cut``."""
    a, b = (stored(SUM, part_of_events(WINDOW, SUM, ((0, {"n": v}) for v in side))) for side in (values[:cut], values[cut:]))
    return answer_values(SUM, merge_parts(WINDOW, SUM, a, b).sessions[0].parts)["sum_n"]


@pytest.mark.parametrize("values", [[2**53, 1, 1], [2**63 - 1, 1, -1], [-(2**63), -1, 1]])
def test_an_integer_sum_is_exact_whatever_the_split(values: list[int]) -> None:
    assert {sum_of(values, cut) for cut in range(len(values) + 1)} == {sum(values)}
    assert isinstance(sum_of(values, 1), int)


def test_an_integer_sum_past_64_bits_answers_overflow_whatever_the_split() -> None:
    assert {sum_of([2**63 - 1, 1, 5], cut) for cut in range(4)} == {OVERFLOW}
    assert sum_of([None, None], 1) == 0  # type: ignore[list-item]


@dataclass(frozen=True)
class SumOfSquares(Measure):
    """A measure of the user's own, with its per-event part."""

    kind: ClassVar[str] = "sumsq"

    def aggregate(self) -> Column:
        return F.sum(self._input() * self._input()).alias(self.name)

    def combine(self, a: Any, b: Any) -> Any:
        return (a or 0) + (b or 0)

    def event_part(self, value: Any) -> Any:
        return None if value is None else value * value


@dataclass(frozen=True)
class Squares(SumOfSquares):
    """The same without a per-event part: a session view cannot know it."""

    kind: ClassVar[str] = "sq"
    event_part = Measure.event_part  # type: ignore[assignment]


def test_a_measure_of_your_own_keeps_its_own_part_or_is_refused_naming_the_fix() -> None:
    mine = SumOfSquares("x")
    View("v", keys=("k",), measures=(Count(), mine), sessions=WINDOW)
    part = part_of_events(WINDOW, (mine,), [(0, {"x": 3}), (MICROS_1, {"x": 4})])
    assert part.sessions[0].parts == {"sumsq_x": 25}
    with pytest.raises(PipelineDefinitionError) as raised:
        View("visits", keys=("k",), measures=(Count(), Squares("x")), sessions=WINDOW)
    assert all(w in str(raised.value) for w in ("'visits'", "sq_x", "event_part", "Count, Sum, Min or Max"))


MICROS_1 = 1_000_000
TYPES = {"t": "timestamp", "n": "bigint", "x": "double", "s": "string", "b": "boolean", "seen": "timestamp",
         "day": "date", "price": "decimal(10,2)"}


@pytest.mark.parametrize("measure", [Max("seen"), Min("day"), Max("price"), Sum("s"), Sum("b")])
def test_an_input_json_would_not_give_back_is_refused_naming_view_measure_and_fix(measure: Measure) -> None:
    with pytest.raises(PipelineDefinitionError) as raised:
        check_session_inputs("visits", SessionWindow(timedelta(seconds=10), time_column="t"), (Count(), measure), TYPES)
    message = str(raised.value)
    assert all(w in message for w in ("'visits'", measure.name, TYPES[measure.column or ""], "transform")), message


def test_inputs_a_session_keeps_exactly_pass_and_the_time_column_must_be_a_timestamp() -> None:
    window = SessionWindow(timedelta(seconds=10), time_column="t")
    check_session_inputs("v", window, (Count(), Sum("n"), Sum("x"), Min("s"), Max("b"), Max("n")), TYPES)
    with pytest.raises(PipelineDefinitionError, match=r"'v'.*'n' is bigint.*timestamp"):
        check_session_inputs("v", SessionWindow(timedelta(seconds=10), time_column="n"), (Count(),), TYPES)


def micros(t: datetime) -> int:
    return (t - EPOCH) // timedelta(microseconds=1)


def test_event_times_from_year_1_to_9999_are_plain_integers() -> None:
    first, last = datetime(1, 1, 1, tzinfo=timezone.utc), datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=timezone.utc)
    events = [(micros(first), {}), (micros(first) + 5 * MICROS_1, {}), (micros(last), {})]
    part = stored((Count(),), part_of_events(WINDOW, (Count(),), events))
    assert [(s.start, s.end, s.parts["count"]) for s in part.sessions] == \
        [(micros(first), micros(first) + 5 * MICROS_1, 2), (micros(last), micros(last), 1)]
