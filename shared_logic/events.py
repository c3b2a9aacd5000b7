"""Event schemas: validation of incoming events and their Arrow / Spark column types.

A pipeline declares its events as a pydantic model with flat fields of type str, int, float,
bool or datetime (optionally ``| None``). Validation happens before anything is written: one bad
event rejects the whole batch, with every problem located by line or index and field.

Besides the model's own rules, every value follows the rules of ``shared_logic.event_values``,
the same on every path (HTTP, file ingest, backfill, Spark ingest): a time is a datetime, ISO 8601
text or epoch-seconds text (never milliseconds; a JSON number is not a time) and must lie in
``TIME_MIN`` .. ``TIME_MAX`` once converted to UTC (the range of a timestamp in Python, Arrow and
Spark; a time with a UTC offset, such as ``0001-01-01T00:00:07+13:33``, can fall outside it); an
integer, in an int or a float field, is within 64 bits; a JSON object names each key once.
Datetimes are stored in UTC; a naive one is taken as UTC.
"""

from __future__ import annotations

import functools
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import pyarrow as pa
from pydantic import BaseModel, TypeAdapter, ValidationError, ValidationInfo, create_model, field_validator
from pydantic_core import PydanticCustomError

from shared_logic.errors import EventProblem, EventValidationError, PipelineDefinitionError
from shared_logic.event_values import (
    INT_MAX,
    INT_MIN,
    TIME_MAX,
    TIME_MIN,
    TIME_RANGE,
    as_utc,
    clip,
    fit_int,
    int_range_error,
    keys_at_most,
    read_time,
    repeated_key,
    repeated_keys_of_array,
)

__all__ = ["INT_MAX", "INT_MIN", "KIND_COLUMN", "TIME_MAX", "TIME_MIN", "TIME_RANGE", "EventSchema", "SortedRecords",
           "as_utc"]

#: Master-dataset column telling event rows from barrier rows (see batch_layer.master.dataset).
KIND_COLUMN = "_kind"

Clock = Callable[[], datetime]


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


_ARROW_TYPES: dict[type, pa.DataType] = {
    str: pa.string(),
    int: pa.int64(),
    float: pa.float64(),
    bool: pa.bool_(),
    datetime: pa.timestamp("us", tz="UTC"),
}


def _field_type(model: type[BaseModel], name: str, annotation: Any) -> tuple[type, bool]:
    """(python type, nullable) of one model field, or PipelineDefinitionError."""
    nullable = False
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        nullable = len(args) < len(typing.get_args(annotation))
        annotation = args[0] if len(args) == 1 else annotation
    if annotation not in _ARROW_TYPES:
        raise PipelineDefinitionError(
            f"event field {model.__name__}.{name} has type {annotation!r}; "
            f"use one of {', '.join(t.__name__ for t in _ARROW_TYPES)} (optionally '| None')"
        )
    return annotation, nullable


class EventSchema:
    """The validated shape of a pipeline's events, and its column layout in the master dataset."""

    def __init__(self, model: type[BaseModel], event_time_field: str | None = "event_time") -> None:
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            raise PipelineDefinitionError(f"an event schema must be a pydantic BaseModel subclass, got {model!r}")
        self.model = model
        self.fields = {n: _field_type(model, n, f.annotation) for n, f in model.model_fields.items()}
        if event_time_field is not None and self.fields.get(event_time_field, (None,))[0] is not datetime:
            raise PipelineDefinitionError(
                f"event_time_field {event_time_field!r} must be a datetime field of {model.__name__}"
            )
        self.event_time_field = event_time_field
        checked = _fitting_columns(model, self.fields)
        # list[checked] spelled as the GenericAlias it is at runtime (`checked` is a value, not a type).
        many: Any = types.GenericAlias(list, (checked,))
        self._many: TypeAdapter[list[BaseModel]] = TypeAdapter(many)
        self._one: TypeAdapter[BaseModel] = TypeAdapter(checked)

    def arrow_schema(self) -> pa.Schema:
        """Columns of the master dataset: the event fields, then ``_kind`` ('event' or 'barrier')."""
        columns = [pa.field(n, _ARROW_TYPES[t], nullable=True) for n, (t, _) in self.fields.items()]
        return pa.schema([*columns, pa.field(KIND_COLUMN, pa.string(), nullable=False)])

    def validate(self, events: Sequence[Any], *, source: str = "request", now: Clock = _utcnow) -> pa.Table:
        """Validate Python dicts (lax: ints become floats, ISO or epoch-seconds strings and numbers of epoch
        seconds become datetimes).

        Returns the events as an Arrow table in master-dataset layout, or raises
        EventValidationError listing every problem by index and field.
        """
        try:
            models = self._many.validate_python(list(events))
        except ValidationError as e:
            raise EventValidationError([_problem(err, lambda i: f"event {i}") for err in e.errors()], source) from e
        return self._to_table(models, now)

    def validate_json_array(self, body: str | bytes, *, source: str, now: Clock = _utcnow) -> pa.Table:
        """Validate a JSON array of events strictly, as :meth:`validate_json_lines` does each line.

        Problems are located as ``index <i>`` (from 0); a document that is not a well-formed JSON
        array is one problem at ``index 0``, field ``(event)``. An object that gives a key twice is a
        problem naming the key.
        """
        try:
            models = self._many.validate_json(body, strict=True)
        except ValidationError as e:
            problems = [_problem(err, lambda i: f"index {i}") for err in e.errors()]
            raise EventValidationError(problems + _repeats_of_array(body), source) from e
        if keys_at_most(body) != sum(len(m.model_fields_set) for m in models):
            repeats = _repeats_of_array(body)
            if repeats:
                raise EventValidationError(repeats, source)
        return self._to_table(models, now)

    def validate_json_lines(
        self, lines: Iterable[tuple[int, str | bytes]], *, source: str, now: Clock = _utcnow
    ) -> pa.Table:
        """Validate JSON documents, one per line, strictly (no string-to-number coercion; each key once).

        Every line is checked, and every problem is reported with its line number and field;
        on any problem nothing is returned.
        """
        checks = ((f"line {number}", functools.partial(self._from_json, text)) for number, text in lines)
        return self._to_table(_each_valid(checks, source), now)

    def sort_json_records(
        self, records: Sequence[tuple[str | bytes | None, datetime | None]], *, now: Clock = _utcnow
    ) -> SortedRecords:
        """Validate records of a stream, one JSON document each, strictly, one at a time: a bad record is
        set aside with its problems and never stops the others (``validate_json_lines`` is all-or-nothing).

        Each record is ``(text, its own time)``: an event without an event time takes the record's time
        (a Kafka record's timestamp), else ``now()``. A record with no value at all (None) is refused.
        """
        models: list[BaseModel] = []
        kept: list[int] = []
        times: list[datetime | None] = []
        refused: list[tuple[int, tuple[EventProblem, ...]]] = []
        for index, (text, stamp) in enumerate(records):
            if text is None:
                refused.append((index, (EventProblem(f"record {index}", "(event)", _NO_VALUE),)))
                continue
            try:
                models.append(self._from_json(text))
            except ValidationError as e:
                refused.append((index, tuple(_problem(err, _naming(f"record {index}")) for err in e.errors())))
                continue
            except _Unfit as e:
                refused.append((index, tuple(EventProblem(f"record {index}", f, m) for f, m in e.problems)))
                continue
            kept.append(index)
            times.append(stamp)
        return SortedRecords(self._to_table(models, now, times), kept, refused)

    def validate_records(
        self, records: Iterable[tuple[str, Mapping[str, Any]]], *, source: str, strict: bool, now: Clock = _utcnow
    ) -> pa.Table:
        """Validate located records (a CSV line's or a Parquet row's values): each is ``(location, values)``,
        ``location`` naming it in problems ("line 7", "row 12"). An absent key is an absent field (its
        default, or a problem when required); unknown keys are problems, as in JSON. ``strict=False``
        coerces text ("12" -> 12, ISO or epoch-seconds strings -> datetimes), for sources that only hold text.

        Every record is checked and every problem reported; on any problem nothing is returned.
        """
        checks = ((location, functools.partial(self._one.validate_python, values, strict=strict))
                  for location, values in records)
        return self._to_table(_each_valid(checks, source), now)

    def _from_json(self, text: str | bytes) -> BaseModel:
        """One event from its JSON text, strictly; _Unfit with every problem, a repeated key included."""
        try:
            model = self._one.validate_json(text, strict=True)
        except ValidationError as e:
            raise _Unfit(_problems(e), repeated_key(text)) from e
        if keys_at_most(text) != len(model.model_fields_set):
            repeated = repeated_key(text)
            if repeated is not None:
                raise _Unfit([], repeated)
        return model

    def _to_table(self, models: Sequence[BaseModel], now: Clock,
                  own_times: Sequence[datetime | None] | None = None) -> pa.Table:
        """Arrow table of validated events (datetimes already in UTC, see ``_fitting_columns``). A
        missing event time becomes the event's own record time (``own_times``) if it has one, else the
        ingest time, once per call, so it is fixed in the master dataset and both layers see the same value."""
        columns: dict[str, list[Any]] = {n: [getattr(m, n) for m in models] for n in self.fields}
        if self.event_time_field:
            stamp = now()
            col = columns[self.event_time_field]
            own = own_times if own_times is not None else [None] * len(col)
            fill = [stamp if o is None else (as_utc(o) or stamp) for o in own]
            columns[self.event_time_field] = [f if t is None else t for t, f in zip(col, fill, strict=True)]
        columns[KIND_COLUMN] = ["event"] * len(models)
        return pa.table(columns, schema=self.arrow_schema())


def _fitting_columns(model: type[BaseModel], fields: dict[str, tuple[type, bool]]) -> type[BaseModel]:
    """``model`` plus the rules of ``shared_logic.event_values``: each datetime read by the time rule and
    fitting a timestamp column (converted to UTC on the way), each int and each integer sent for a float
    within 64 bits, so such problems are reported with the model's own, located by line or index and
    field, in the same pass."""
    times = [n for n, (kind, _) in fields.items() if kind is datetime]
    ints = [n for n, (kind, _) in fields.items() if kind is int]
    floats = [n for n, (kind, _) in fields.items() if kind is float]
    validators: dict[str, Any] = {}
    if times:
        validators["_lambda_read_times"] = field_validator(*times, mode="before")(_read_time)
        validators["_lambda_fit_times"] = field_validator(*times)(_fit_time)
    if ints:
        validators["_lambda_fit_ints"] = field_validator(*ints)(_fit_int)
    if floats:
        validators["_lambda_fit_floats"] = field_validator(*floats, mode="before")(_fit_float)
    if not validators:
        return model
    return create_model(model.__name__, __base__=model, __module__=model.__module__, __validators__=validators)


def _read_time(cls: type, value: Any, info: ValidationInfo) -> Any:
    return read_time(value, json_mode=info.mode == "json")


def _fit_time(cls: type, value: datetime | None) -> datetime | None:
    if value is None:
        return None
    utc = as_utc(value)
    if utc is None:
        raise PydanticCustomError(
            "time_range", "{value} is outside the supported time range {range} (in UTC, after applying its offset)",
            {"value": value.isoformat(), "range": TIME_RANGE},
        )
    return utc


def _fit_int(cls: type, value: int | None) -> int | None:
    if value is not None and not INT_MIN <= value <= INT_MAX:
        raise int_range_error(value, "int")
    return value


def _fit_float(cls: type, value: Any) -> Any:
    return value if type(value) is float else fit_int(value, "float")


@dataclass(frozen=True)
class SortedRecords:
    """A stream's records sorted by :meth:`EventSchema.sort_json_records`: the valid ones as events in
    master layout (``kept``: their indexes, in order), the others with their problems."""

    events: pa.Table
    kept: list[int]
    refused: list[tuple[int, tuple[EventProblem, ...]]]


_NO_VALUE = "the record has no value (an empty or tombstone record): one JSON object per record is expected"


class _Unfit(Exception):
    """One event's problems: (field, message) pairs, and the key its JSON object gives twice (or None)."""

    def __init__(self, problems: list[tuple[str, str]], repeated: str | None) -> None:
        super().__init__("an event does not fit its model")
        self.problems = problems + ([] if repeated is None else [(clip(repeated), _REPEATED)])


_REPEATED = ("given more than once in one JSON object: each field is sent once (a JSON parser would keep "
             "only the last value); nothing was written")


def _repeats_of_array(body: str | bytes) -> list[EventProblem]:
    return [EventProblem(f"index {i}", clip(key), _REPEATED) for i, key in repeated_keys_of_array(body)]


def _naming(location: str) -> Callable[[int], str]:
    """Locator naming ``location`` whatever index pydantic reports (one record at a time)."""
    return lambda _: location


def _each_valid(checks: Iterable[tuple[str, Callable[[], BaseModel]]], source: str) -> list[BaseModel]:
    """Every check's model, in order; EventValidationError listing every problem of every check (each named by
    its location: "line 7", "row 12", whatever index pydantic reports, one record at a time) if any fails."""
    models: list[BaseModel] = []
    problems: list[EventProblem] = []
    for location, check in checks:
        try:
            models.append(check())
        except ValidationError as e:
            problems.extend(_problem(err, _naming(location)) for err in e.errors())
        except _Unfit as e:
            problems.extend(EventProblem(location, field, message) for field, message in e.problems)
    if problems:
        raise EventValidationError(problems, source)
    return models


def _problems(error: ValidationError) -> list[tuple[str, str]]:
    return [(p.field, p.message) for p in (_problem(err, _naming("")) for err in error.errors())]


def _problem(err: Any, locate: Callable[[int], str]) -> EventProblem:
    loc = list(err["loc"])
    index = loc.pop(0) if loc and isinstance(loc[0], int) else 0
    where = locate(index)
    field = clip(".".join(str(p) for p in loc)) or "(event)"
    return EventProblem(where, field, err["msg"])
