"""The key layout spelled in Spark (``serving.store.columns``) agrees with its Python owner (``serving.store.keys``).

Oracles: ``encode_key``, ``suffix``, ``Keys.bucket_of`` and ``Keys`` names for the names; for a row's
value, the parts computed here in plain Python and compared after JSON decoding (the readers decode
it: the spelling of a double may differ, its value may not; a part that is not finite, an overflowed sum,
reads +inf: ``shared_logic.measures.OVERFLOW_PART``).
"""

from __future__ import annotations

import json
import math
import random
import struct
from datetime import datetime, timedelta, timezone
from typing import Any

from pyspark.sql import functions as F

from serving.store.columns import bucket_column, bucket_name_column, key_column, row_value_column, suffix_column
from serving.store.keys import Keys, encode_key, suffix
from serving.store.row_format import EXACT_DISTINCT_MAX
from shared_logic.measures import Count, Distinct, Max, Sum
from shared_logic.views import TumblingWindow, View

KEYS = [("a", "b"), ("a|b", "c"), ("a\\", "|"), ("ünï", "😀"), ("", "x")]


def test_keys_buckets_and_names_agree_with_python(spark: Any) -> None:
    keys = Keys("p", buckets=5)
    df = spark.createDataFrame(KEYS, "k1 string, k2 string").withColumn("key", key_column(["k1", "k2"]))
    out = df.select("k1", "k2", "key", bucket_column(keys, F.col("key")).alias("b"),
                    bucket_name_column(keys, F.col("key"), lambda b: b.rows(7, "v")).alias("name")).collect()
    for row in out:
        assert row.key == encode_key((row.k1, row.k2))
        assert row.b == keys.bucket_of(row.key)
        assert row.name == keys.for_key(row.key).rows(7, "v")
    assert {r.b for r in out} != {0}  # the keys spread: the test would not notice a constant bucket
    one = Keys("p")
    assert df.select(bucket_name_column(one, F.col("key"), lambda b: b.rows(7, "v")).alias("n")).first().n == one.rows(7, "v")


def test_window_suffixes_agree_with_python(spark: Any) -> None:
    starts = [datetime(2026, 11, 26, h, tzinfo=timezone.utc) for h in (0, 13)]
    df = spark.createDataFrame([(s,) for s in starts], "window_start timestamp")
    got = [r.s for r in df.select(suffix_column("window_start").alias("s")).collect()]
    assert got == [suffix(int(s.timestamp())) for s in starts]
    assert df.select(suffix_column(None).alias("s")).first().s == suffix(None)


def test_a_rows_value_decodes_to_its_parts(spark: Any) -> None:
    view = View("v", keys=("k",), measures=(Count(), Sum("x"), Max("x"), Distinct("w")),
                window=TumblingWindow(timedelta(hours=1)))
    random.seed(7)
    doubles = [0.1 + 0.2, 1e23, -0.0, 5e-324, 1e16, float("inf"), float("nan"), None,
               *(struct.unpack("d", random.randbytes(8))[0] for _ in range(200))]
    widths = [0, 1, EXACT_DISTINCT_MAX, EXACT_DISTINCT_MAX + 1, None]
    rows = [(i, d, -d if d is not None else None, _members(widths[i % len(widths)]))
            for i, d in enumerate(doubles)]
    df = spark.createDataFrame(rows, "count long, sum_x double, max_x double, distinct_w array<string>")
    for (n, total, top, who), got in zip(rows, (r.v for r in df.select(row_value_column(view).alias("v")).collect())):
        parts = json.loads(got, parse_constant=_not_json)  # strict JSON: no Infinity, no NaN
        assert [m.name for m in (*view.scalar_measures, *view.distinct_measures)] == [
            "count", "sum_x", "max_x", "distinct_w"]
        assert parts[0] == float(n)
        for value, part in ((total, parts[1]), (top, parts[2])):
            # Not finite: an overflowed sum (the one such part a view holds), +inf whatever its sign.
            assert (part is None) if value is None else (part == value if math.isfinite(value) else part == math.inf)
        expected = None if who is not None and len(who) > EXACT_DISTINCT_MAX else (who or [])
        assert parts[3] == expected


def _not_json(constant: str) -> None:
    raise AssertionError(f"{constant} is not JSON")


def _members(width: int | None) -> list[str] | None:
    return None if width is None else [f"m{i} \"ü\"\\\n" for i in range(width)]
