"""Duplicates never counted: the one rule both layers apply to a pipeline that declares an event id.

A pipeline may name an id field and a horizon (``Pipeline.event_id_field``, ``event_id_horizon``).
The rule then decides, from the master dataset alone, which event rows reach the views:

* **Master order.** Events are ordered by the master version that added them (``_version``); the
  *clock* of version v is the running maximum of the commit timestamps of versions 0..v, so it never
  goes back even when writers' wall clocks disagree.
* **One candidate per id and version.** Of the rows of one version sharing an id, the one with the
  smallest content key (:func:`with_key`: a SHA-256 of the row's fields) is that version's
  candidate; the others never count. Rows with the same key are the same event, field for field.
* **The horizon.** A candidate counts iff its id's previous occurrence (the nearest earlier version
  holding the id, counted or not) is more than the horizon older by the clock, or there is none.

So within the horizon the first occurrence in master order is the one that counts, and an id seen
again after a longer silence counts again. Everything the rule reads (versions, commit timestamps,
row contents) is fixed once committed, so the batch layer (over the whole master) and the speed
layer (over its micro-batches and what it remembers of the horizon) decide every row alike, and
merged answers stay exact. Rows whose id is null (written before the field was declared) are not
deduplicated. The functions here are pure: DataFrames in, DataFrames out.
"""

from __future__ import annotations

from datetime import timedelta

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

#: Columns of an occurrence table: the id, the master version, its clock (epoch microseconds), the key.
ID, VERSION, CLOCK, KEY = "event_id", "version", "clock", "key"
#: A candidate's count of rows (of its id and version), for counting what was left out.
ROWS = "rows"
#: The content key's format (``content_key``): part of where the event-id index lives, so a change starts a new one.
KEY_FORMAT = 1
#: The content key's column on event rows (event fields never start with ``_``).
ROW_KEY = "_key"
_ROW_ID, _PREVIOUS, _COPIES = "_id", "_previous_clock", "_copies"
#: Times in the key to the microsecond (Spark's JSON default stops at milliseconds), in UTC.
_MICROSECONDS = "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX"
#: The shortest horizon a pipeline may declare: commit timestamps come from writers' clocks.
MIN_HORIZON = timedelta(minutes=1)


def content_key(columns: list[str]) -> Column:
    """A row's content key: SHA-256 (hex) of its fields as JSON, in name order. Null fields are left out
    of the JSON, so a column added to the master later (null in older rows) leaves older keys as they were."""
    fields = F.struct(*[F.col(c) for c in sorted(columns)])
    return F.sha2(F.to_json(fields, {"timestampFormat": _MICROSECONDS}), 256)


def with_key(events: DataFrame, columns: list[str]) -> DataFrame:
    """``events`` with a ``_key`` column over ``columns`` (the event fields)."""
    return events.withColumn(ROW_KEY, content_key(columns))


def candidates(events: DataFrame, id_field: str, version_column: str) -> DataFrame:
    """One occurrence per (id, version) from keyed event rows: ``event_id``, ``version``, ``key`` (the
    smallest) and ``rows`` (how many rows hold the id there). Rows with a null id are no occurrence."""
    return (events.where(F.col(id_field).isNotNull())
            .groupBy(F.col(id_field).cast("string").alias(ID), F.col(version_column).alias(VERSION))
            .agg(F.min(ROW_KEY).alias(KEY), F.count("*").alias(ROWS)))


def counted(occurrences: DataFrame, horizon: timedelta) -> DataFrame:
    """The occurrences that count (same columns), from occurrences with their ``clock``: those whose id's
    previous occurrence is more than ``horizon`` older, or has none. The input must hold every occurrence
    that can be a previous one (earlier versions of the same ids, back one horizon at least)."""
    previous = F.lag(CLOCK).over(Window.partitionBy(ID).orderBy(VERSION))
    limit = int(horizon.total_seconds() * 1_000_000)
    return (occurrences.withColumn(_PREVIOUS, previous)
            .where(F.col(_PREVIOUS).isNull() | (F.col(CLOCK) - F.col(_PREVIOUS) > limit))
            .drop(_PREVIOUS))


def keep(events: DataFrame, kept: DataFrame, id_field: str, by: tuple[str, ...] = ()) -> DataFrame:
    """The keyed event rows the rule keeps (without ``_key``): for each (id, ``by``, key) of ``kept``
    (counted occurrences), as many copies as it has there; rows with a null id all stay.

    ``by`` names the event rows' version column when they have one (the speed layer's ``_version``); the
    batch layer, whose snapshot rows carry no version, keeps one copy per counted version of an (id, key).
    Rows with one (id, key) are the same event field for field, so which copy is kept does not matter."""
    ids = F.col(id_field).cast("string")
    copies = (kept.groupBy(F.col(ID).alias(_ROW_ID), *[F.col(VERSION).alias(b) for b in by], F.col(KEY).alias(ROW_KEY))
              .agg(F.count("*").alias(_COPIES)))
    distinct = events.where(ids.isNotNull()).dropDuplicates([id_field, *by, ROW_KEY]).withColumn(_ROW_ID, ids)
    chosen = (distinct.join(copies, [_ROW_ID, *by, ROW_KEY])
              .withColumn(_COPIES, F.explode(F.sequence(F.lit(1), F.col(_COPIES))))
              .drop(_COPIES, _ROW_ID))
    return chosen.unionByName(events.where(ids.isNull())).drop(ROW_KEY)
