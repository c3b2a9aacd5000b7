"""Event schemas: validation of incoming events and their Arrow / Spark column types.

A pipeline declares its events as a pydantic model with flat fields of type str, int, float,
bool or datetime (optionally ``| None``). Validation happens before anything is written: one bad
event rejects the whole batch, with every problem located by line or index and field.

Besides the model's own rules, every value must fit its master-dataset column: a datetime must
lie in ``TIME_MIN`` .. ``TIME_MAX`` once converted to UTC (the range of a timestamp in Python,
Arrow and Spark; a time with a UTC offset, such as ``0001-01-01T00:00:07+13:33``, can fall outside
it) and an int in the 64-bit signed range. Datetimes are stored in UTC; a naive one is taken as UTC.
"""

from __future__ import annotations

import functools
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

import pyarrow as pa
from pydantic import BaseModel, TypeAdapter, ValidationError, create_model, field_validator
from pydantic_core import PydanticCustomError

from shared_logic.errors import EventProblem, EventValidationError, PipelineDefinitionError

#: Master-dataset column telling event rows from barrier rows (see batch_layer.master.dataset).
KIND_COLUMN = "_kind"

Clock = Callable[[], datetime]

#: Earliest and latest time an event (or a query) may name, in UTC: the range of a timestamp.
TIME_MIN = datetime.min.replace(tzinfo=timezone.utc)
TIME_MAX = datetime.max.replace(tzinfo=timezone.utc)
#: The allowed range as people read it (in messages and documentation).
TIME_RANGE = "0001-01-01T00:00:00Z to 9999-12-31T23:59:59.999999Z"
#: Range of an int field (an Arrow / Spark 64-bit signed integer column).
INT_MIN, INT_MAX = -(2**63), 2**63 - 1


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
        """Validate Python dicts (lax: ints become floats, ISO strings become datetimes).

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
        array is one problem at ``index 0``, field ``(event)``.
        """
        try:
            models = self._many.validate_json(body, strict=True)
        except ValidationError as e:
            raise EventValidationError([_problem(err, lambda i: f"index {i}") for err in e.errors()], source) from e
        return self._to_table(models, now)

    def validate_json_lines(
        self, lines: Iterable[tuple[int, str | bytes]], *, source: str, now: Clock = _utcnow
    ) -> pa.Table:
        """Validate JSON documents, one per line, strictly (no string-to-number coercion).

        Every line is checked, and every problem is reported with its line number and field;
        on any problem nothing is returned.
        """
        checks = ((f"line {number}", functools.partial(self._one.validate_json, text, strict=True))
                  for number, text in lines)
        return self._to_table(_each_valid(checks, source), now)

    def validate_records(
        self, records: Iterable[tuple[str, Mapping[str, Any]]], *, source: str, strict: bool, now: Clock = _utcnow
    ) -> pa.Table:
        """Validate located records (a CSV line's or a Parquet row's values): each is ``(location, values)``,
        ``location`` naming it in problems ("line 7", "row 12"). An absent key is an absent field (its
        default, or a problem when required); unknown keys are problems, as in JSON. ``strict=False``
        coerces text ("12" -> 12, ISO strings -> datetimes), for sources that only hold text.

        Every record is checked and every problem reported; on any problem nothing is returned.
        """
        checks = ((location, functools.partial(self._one.validate_python, values, strict=strict))
                  for location, values in records)
        return self._to_table(_each_valid(checks, source), now)

    def _to_table(self, models: Sequence[BaseModel], now: Clock) -> pa.Table:
        """Arrow table of validated events (datetimes already in UTC, see ``_fitting_columns``). A
        missing event time becomes the ingest time, once per call, so it is fixed in the master
        dataset and both layers see the same value."""
        columns: dict[str, list[Any]] = {n: [getattr(m, n) for m in models] for n in self.fields}
        if self.event_time_field:
            stamp = now()
            col = columns[self.event_time_field]
            columns[self.event_time_field] = [stamp if t is None else t for t in col]
        columns[KIND_COLUMN] = ["event"] * len(models)
        return pa.table(columns, schema=self.arrow_schema())


def _fitting_columns(model: type[BaseModel], fields: dict[str, tuple[type, bool]]) -> type[BaseModel]:
    """``model`` plus checks that each datetime fits a timestamp column (converted to UTC on the way)
    and each int a 64-bit column, so such problems are reported with the model's own, located by
    line or index and field, in the same pass."""
    times = [n for n, (kind, _) in fields.items() if kind is datetime]
    ints = [n for n, (kind, _) in fields.items() if kind is int]
    validators: dict[str, Any] = {}
    if times:
        validators["_lambda_fit_times"] = field_validator(*times)(_fit_time)
    if ints:
        validators["_lambda_fit_ints"] = field_validator(*ints)(_fit_int)
    if not validators:
        return model
    return create_model(model.__name__, __base__=model, __module__=model.__module__, __validators__=validators)


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
        raise PydanticCustomError("int_range", "{value} is outside the 64-bit integer range {min} to {max}",
                                  {"value": value, "min": INT_MIN, "max": INT_MAX})
    return value


def as_utc(t: datetime) -> datetime | None:
    """``t`` in UTC (a naive ``t`` is taken as UTC), or None when that is outside ``TIME_MIN`` .. ``TIME_MAX``."""
    if t.tzinfo is None:
        return t.replace(tzinfo=timezone.utc)
    try:
        return t.astimezone(timezone.utc)
    except OverflowError:
        return None


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
    if problems:
        raise EventValidationError(problems, source)
    return models


def _problem(err: Any, locate: Callable[[int], str]) -> EventProblem:
    loc = list(err["loc"])
    index = loc.pop(0) if loc and isinstance(loc[0], int) else 0
    where = locate(index)
    field = ".".join(str(p) for p in loc) or "(event)"
    return EventProblem(where, field, err["msg"])

