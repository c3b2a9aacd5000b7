"""The duplicates rule (``shared_logic.dedup``) against a from-scratch oracle in plain Python.

Random occurrences (ids, versions, clocks that sometimes go back, repeats within a version, gaps
longer than the horizon): the oracle walks each id's versions in order and counts a version iff the
id's previous version is more than the horizon older by the running-max clock. ``keep`` then keeps
exactly the counted rows' copies, and a content key does not change when a column is added (null).
"""

from __future__ import annotations

import random
from datetime import timedelta
from typing import Any

import pytest
from pyspark.sql import DataFrame

from shared_logic.dedup import CLOCK, ID, KEY, VERSION, candidates, content_key, counted, keep, with_key
from shared_logic.errors import PipelineDefinitionError
from shared_logic.measures import Count
from shared_logic.pipeline import EventModel, Pipeline
from shared_logic.views import View

HORIZON = timedelta(minutes=2)
SPAN = 120 * 1_000_000


def _clocks(rng: random.Random, versions: int) -> dict[int, int]:
    """Each version's clock: the running max of commit times that drift forward and sometimes back."""
    clocks, stamp, high = {}, 0, 0
    for version in range(1, versions + 1):
        stamp += rng.choice([1, 5, 30, 90, 200, -40]) * 1_000_000
        high = clocks[version] = max(high, stamp)
    return clocks


def _oracle(rows: list[tuple[str, int, str]], clocks: dict[int, int]) -> list[tuple[str, int, str]]:
    """(id, version, key) of the rows that count: per id and version the smallest key, if the id's
    previous version is more than the horizon older."""
    best: dict[tuple[str, int], str] = {}
    for ident, version, key in rows:
        best[ident, version] = min(key, best.get((ident, version), key))
    counted_rows, previous = [], {}
    for (ident, version), key in sorted(best.items(), key=lambda item: (item[0][1], item[0][0])):
        if ident not in previous or clocks[version] - previous[ident] > SPAN:
            counted_rows.append((ident, version, key))
        previous[ident] = clocks[version]
    return sorted(counted_rows)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_rule_counts_what_the_oracle_counts(spark: Any, seed: int) -> None:
    rng = random.Random(seed)
    clocks = _clocks(rng, 40)
    rows = [(f"id{rng.randrange(12)}", rng.randint(1, 40), f"k{rng.randrange(3)}") for _ in range(300)]
    events = spark.createDataFrame(rows, "pid string, _version long, _key string")
    found = candidates(events, "pid", "_version").toPandas()
    found[CLOCK] = [clocks[v] for v in found[VERSION]]
    occurrences = spark.createDataFrame(found[[ID, VERSION, CLOCK, KEY]])
    got = sorted((r[ID], r[VERSION], r[KEY]) for r in counted(occurrences, HORIZON).collect())
    assert got == _oracle(rows, clocks)

    kept = keep(events, counted(occurrences, HORIZON), "pid", by=("_version",)).collect()
    assert kept and "_key" not in kept[0].asDict()
    assert sorted((r["pid"], r["_version"]) for r in kept) == sorted((i, v) for i, v, _ in _oracle(rows, clocks))


def test_keep_without_versions_keeps_one_copy_per_counted_version(spark: Any) -> None:
    """The batch layer's snapshot rows carry no version: an (id, content) counted in two versions (more
    than a horizon apart) keeps two copies; rows with a null id all stay."""
    rows = [("a", 1.0), ("a", 1.0), ("a", 1.0), ("b", 2.0), (None, 3.0), (None, 3.0)]
    events = with_key(spark.createDataFrame(rows, "pid string, amount double"), ["pid", "amount"])
    keys = {r["pid"]: r["_key"] for r in events.collect() if r["pid"]}
    kept_occurrences = spark.createDataFrame(
        [("a", 1, 0, keys["a"]), ("a", 9, SPAN * 2, keys["a"]), ("b", 1, 0, keys["b"])],
        f"{ID} string, {VERSION} long, {CLOCK} long, {KEY} string")
    got = sorted((r["pid"] or "", r["amount"]) for r in keep(events, kept_occurrences, "pid").collect())
    assert got == [("", 3.0), ("", 3.0), ("a", 1.0), ("a", 1.0), ("b", 2.0)]


def test_a_content_key_is_kept_when_a_null_column_is_added(spark: Any) -> None:
    """Old rows read after the master gained a column hold null there: their keys must not change."""
    before = spark.createDataFrame([("a", 1.5, "2026-01-01 00:00:00.000001")], "pid string, amount double, t string") \
        .selectExpr("pid", "amount", "cast(t as timestamp) as t")
    after = before.selectExpr("*", "cast(null as string) as note")
    one = before.select(content_key(["pid", "amount", "t"])).first()[0]
    two = after.select(content_key(["pid", "amount", "t", "note"])).first()[0]
    assert one == two
    other = before.selectExpr("pid", "amount", "t + interval 1 microsecond as t")  # keys see microseconds
    assert other.select(content_key(["pid", "amount", "t"])).first()[0] != one


class _Sale(EventModel):
    sale_id: str
    price: float


@pytest.mark.parametrize(("field", "horizon", "says"), [
    ("order_id", timedelta(days=1), "must name a str or int field of _Sale (its fields: sale_id, price"),
    ("price", timedelta(days=1), "must name a str or int field"),
    ("sale_id", timedelta(seconds=5), "at least 0:01:00"),
])
def test_a_bad_event_id_declaration_is_refused_with_the_fix(field: str, horizon: timedelta, says: str) -> None:
    class Sales(Pipeline):
        name = "sales"
        event_model = _Sale
        event_time_field = None
        event_id_field = field
        event_id_horizon = horizon
        views = (View("sales", keys=("sale_id",), measures=(Count(),)),)

        def transform(self, events: DataFrame) -> DataFrame:
            return events

    with pytest.raises(PipelineDefinitionError, match=says.replace("(", r"\(")):
        Sales()
