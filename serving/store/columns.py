"""The key layout spelled as Spark columns, for the writers (batch publish, speed segments).

``serving.store.keys`` owns the encoding; these are the same encoding in Spark, kept beside it
and tested against it, so readers of the store never import pyspark.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import IntegralType

from serving.store.keys import KEY_SEPARATOR, WINDOW_SEPARATOR, Keys
from serving.store.row_format import EXACT_DISTINCT_MAX
from shared_logic.measures import Sum
from shared_logic.sessions import SESSIONS_COLUMN
from shared_logic.views import View

#: An overflowed sum's part (``shared_logic.measures.OVERFLOW_PART``, +inf) in a batch row: a JSON number that
#: every reader (Python's json, Lua's cjson) reads as +inf. (A realtime row's parts are strings: ``inf``.)
OVERFLOW_JSON = "1e999"


def key_column(keys: Sequence[str]) -> Column:
    """The key encoding as a Spark column (must agree with ``encode_key``)."""
    if len(keys) == 1:
        return F.col(keys[0]).cast("string")
    escaped = (F.regexp_replace(F.col(k).cast("string"), r"([\\|])", r"\\$1") for k in keys)
    return F.concat_ws(KEY_SEPARATOR, *escaped)


def window_column(window_start: str | None) -> Column:
    """Window start in epoch seconds as a string ('' for all-time views), as Lua scripts take it."""
    if window_start is None:
        return F.lit("")
    return F.unix_seconds(F.col(window_start)).cast("string")


def integral_parts(view: View, rows: DataFrame) -> list[str]:
    """The scalar measures of ``view`` whose values are integers over ``rows``: those whose aggregate has
    an integral Spark type (counts; minima and maxima of integer columns), and sums of integer columns
    (a sum's part is a double, to hold an overflow: ``shared_logic.measures.Sum``). Analysis only, no job."""
    scalar = {m.name for m in view.scalar_measures}
    types = {f.name: f.dataType for f in rows.schema.fields}
    sums = {m.name for m in view.scalar_measures if isinstance(m, Sum) and isinstance(types.get(m.column or ""),
                                                                                      IntegralType)}
    return [f.name for f in view.aggregate(rows).schema.fields
            if f.name in scalar and (isinstance(f.dataType, IntegralType) or f.name in sums)]


def suffix_column(window_start: str | None) -> Column:
    """``suffix`` in Spark: '' for all-time views, else '@' and the window start in epoch seconds."""
    if window_start is None:
        return F.lit("")
    return F.concat(F.lit(WINDOW_SEPARATOR), window_column(window_start))


def bucket_column(keys: Keys, key: Column) -> Column:
    """``Keys.bucket_of`` in Spark: CRC-32 of the key's UTF-8 bytes, modulo the bucket count."""
    if keys.buckets == 1:
        return F.lit(0)
    return (F.crc32(key.cast("binary")) % keys.buckets).cast("int")


def bucket_name_column(keys: Keys, key: Column, name: Callable[[Keys], str]) -> Column:
    """``name(keys.for_key(key))`` in Spark: a name spelled by ``Keys``, in the bucket of each row's key."""
    if keys.buckets == 1:
        return F.lit(name(keys))
    names = F.array(*(F.lit(name(bucket)) for bucket in keys.all_buckets()))
    return F.element_at(names, bucket_column(keys, key) + 1)


def row_value_column(view: View) -> Column:
    """A batch row's parts as the rows hash keeps them (``serving.store.keys``): a JSON array in
    ``row_parts`` order, scalars as doubles (Java's shortest round-tripping spelling; null when
    absent; an overflowed sum, infinite, as ``OVERFLOW_JSON``: JSON has no infinity), each distinct
    measure's values as an array, or null above ``EXACT_DISTINCT_MAX``. A session view's row is its key's
    session part as ``View.aggregate`` encoded it (``shared_logic.session_parts.encode_part``)."""
    if view.sessions is not None:
        return F.col(SESSIONS_COLUMN)
    parts = []
    for m in view.scalar_measures:
        value = F.col(m.name).cast("double")
        spelled = F.when(F.isnan(value) | (F.abs(value) == F.lit(float("inf"))), F.lit(OVERFLOW_JSON))
        parts.append(F.coalesce(spelled.otherwise(value.cast("string")), F.lit("null")))
    for measure in view.distinct_measures:
        values = F.col(measure.name)
        parts.append(F.when(F.size(values) > EXACT_DISTINCT_MAX, F.lit("null"))
                     .otherwise(F.coalesce(F.to_json(values), F.lit("[]"))))
    return F.concat(F.lit("["), F.concat_ws(",", *parts), F.lit("]"))
