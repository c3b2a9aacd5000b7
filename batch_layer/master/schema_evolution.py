"""Schema evolution: how the master dataset follows a change of the pipeline's event model.

The master dataset is immutable (Lambda architecture: recorded data is never dropped or rewritten),
so its columns may only grow. Comparing the existing table's columns with the model's
(``EventSchema.arrow_schema()``), field by field:

* **A new field with a default** (``| None = None``, or any default): the column is added to the
  table, once, in one commit that writes no rows, before anything else is written. Old rows read
  it as null (Delta fills a column a file lacks with nulls), whatever the default: the default
  applies to events validated from now on, not to what was recorded before.
* **A new required field** (no default): refused when the table holds rows, since they cannot
  satisfy it; make it optional (``| None = None``) or start on a new data dir. On a table that
  holds no rows yet it is added like an optional one.
* **A field the table has and the model no longer has**: refused. Put it back (optional is fine):
  old rows keep their values and new events may leave it empty.
* **A field whose type changed**: refused, naming both types. Add a new field (with a new name)
  instead; the old one stays, optional if new events no longer carry it.

Every problem is reported at once (``SchemaChangeError``, one line per field); the column order
does not matter (Delta and every reader here match columns by name). A change of the event schema
is also a change of the pipeline's logic (``shared_logic.logic``): the views are recomputed.
This module decides; the storage engines do the reading and the one committing
(``StorageEngine.table_state`` / ``add_columns``).
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from batch_layer.errors import SchemaChangeError
from shared_logic.events import KIND_COLUMN, EventSchema

#: Column types as the event model spells them (messages name the Python type a user wrote).
_PYTHON_NAMES: dict[pa.DataType, str] = {
    pa.string(): "str",
    pa.int64(): "int",
    pa.float64(): "float",
    pa.bool_(): "bool",
    pa.timestamp("us", tz="UTC"): "datetime",
}
_TEXT = (pa.large_string(), pa.string_view())


@dataclass(frozen=True)
class SchemaEvolution:
    """What the table needs to hold the model's events: columns to add (empty: nothing to do)."""

    added: tuple[pa.Field, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.added)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.added)


def plan_evolution(table: pa.Schema, schema: EventSchema, *, holds_rows: bool, where: str) -> SchemaEvolution:
    """The columns to add to a table with columns ``table`` so it holds events of ``schema``;
    SchemaChangeError (naming every field and its fix) when it cannot. ``holds_rows``: the table
    holds rows (then no required field may be added). ``where`` names the table in messages."""
    wanted = schema.arrow_schema()
    have = {f.name: f for f in table}
    problems: dict[str, str] = {}
    added: list[pa.Field] = []
    for name in have:
        if name != KIND_COLUMN and wanted.get_field_index(name) < 0:
            problems[name] = (
                f"the master dataset holds it but the event model no longer has it. The master dataset is "
                f"immutable (recorded data is never dropped): put the field back, optional is fine "
                f"(`{name}: {type_name(have[name].type)} | None = None`)"
            )
    for field in wanted:
        if field.name not in have:
            if holds_rows and _required(schema, field.name):
                problems[field.name] = (
                    "it is new and required, but the master dataset already holds events that do not have "
                    f"it: make it optional (`{field.name}: {type_name(field.type)} | None = None`), or start "
                    "on a new data dir"
                )
            else:
                added.append(field)
        elif not _same_type(have[field.name].type, field.type):
            problems[field.name] = (
                f"its type changed from {type_name(have[field.name].type)} (in the master dataset) to "
                f"{type_name(field.type)} (in the event model); recorded values keep their type: add a new "
                f"field for the new type instead, and keep {field.name!r} as {type_name(have[field.name].type)} "
                "(optional is fine)"
            )
    if problems:
        raise SchemaChangeError(where, problems)
    return SchemaEvolution(tuple(added))


def type_name(kind: pa.DataType) -> str:
    """A column type as the event model spells it (``int``), or Arrow's name for any other."""
    return _PYTHON_NAMES.get(_normal(kind), str(kind))


def _normal(kind: pa.DataType) -> pa.DataType:
    """Types that are one Delta type: string spellings, and timestamps of every unit with a zone."""
    if kind in _TEXT:
        return pa.string()
    if pa.types.is_timestamp(kind) and kind.tz is not None:
        return pa.timestamp("us", tz="UTC")
    return kind


def _same_type(a: pa.DataType, b: pa.DataType) -> bool:
    return _normal(a) == _normal(b)


def _required(schema: EventSchema, name: str) -> bool:
    """The model field ``name`` has no default: every event must carry it."""
    info = schema.model.model_fields.get(name)
    return info is not None and info.is_required()
