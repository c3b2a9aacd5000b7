"""The Redis key layout of the serving store, shared by the layers that write it and the API that reads it.

For pipeline ``p`` (prefix ``lp:p``)::

    lp:p:current                       generation pointer: the master version V of the served batch views
    lp:p:generations                   set of generations that have keys in Redis (loaded or loading)
    lp:p:g:{V}:meta                    hash: version, computed_at, rows per view
    lp:p:g:{V}:{view}:v                hash: field -> JSON object of the scalar measure parts
    lp:p:g:{V}:{view}:d:{measure}:{field}   HyperLogLog of a Distinct measure

A *field* names one row of a view: its key values joined by ``|``, then ``@`` and the window start
in epoch seconds for windowed views (``alice``, ``alice@1767225600``). Everything of generation V
lives under ``lp:p:g:{V}:``, so a generation is loaded beside the served one and dropped whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.sql import Column
from pyspark.sql import functions as F

KEY_SEPARATOR = "|"
WINDOW_SEPARATOR = "@"


def encode_field(key: Sequence[str] | str, window_start: int | None = None) -> str:
    """The hash field of a view row (must agree with ``field_column``)."""
    text = key if isinstance(key, str) else KEY_SEPARATOR.join(key)
    return text if window_start is None else f"{text}{WINDOW_SEPARATOR}{window_start}"


def field_column(keys: Sequence[str], window_start: str | None) -> Column:
    """The same encoding as a Spark column, so executors write fields the API can address."""
    text = F.concat_ws(KEY_SEPARATOR, *(F.col(k).cast("string") for k in keys))
    if window_start is None:
        return text
    return F.concat(text, F.lit(WINDOW_SEPARATOR), F.unix_seconds(F.col(window_start)).cast("string"))


@dataclass(frozen=True)
class Keys:
    """Key names for one pipeline's views in Redis."""

    pipeline: str
    namespace: str = "lp"

    @property
    def prefix(self) -> str:
        return f"{self.namespace}:{self.pipeline}"

    @property
    def current(self) -> str:
        return f"{self.prefix}:current"

    @property
    def generations(self) -> str:
        return f"{self.prefix}:generations"

    def generation_prefix(self, generation: int) -> str:
        return f"{self.prefix}:g:{generation}"

    def meta(self, generation: int) -> str:
        return f"{self.generation_prefix(generation)}:meta"

    def values(self, generation: int, view: str) -> str:
        return f"{self.generation_prefix(generation)}:{view}:v"

    def sketch(self, generation: int, view: str, measure: str, field: str) -> str:
        return f"{self.generation_prefix(generation)}:{view}:d:{measure}:{field}"
