"""The key layout spelled as Spark columns, for the writers (batch publish, speed segments).

``serving.store.keys`` owns the encoding; these are the same encoding in Spark, kept beside it
and tested against it, so readers of the store never import pyspark.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import IntegralType

from serving.store.keys import KEY_SEPARATOR
from shared_logic.views import View


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
    an integral Spark type (counts; sums, minima and maxima of integer columns). Analysis only, no job."""
    scalar = {m.name for m in view.scalar_measures}
    return [f.name for f in view.aggregate(rows).schema.fields if f.name in scalar and isinstance(f.dataType, IntegralType)]
