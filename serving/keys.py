"""The Redis key layout of the serving store, shared by the layers that write it and the API that reads it.

For pipeline ``p`` (prefix ``lp:p``), batch generation ``G`` and realtime segment based at ``B``::

    lp:p:current                              generation pointer: the master version G served
    lp:p:generations / lp:p:segments          sets of generations / segment bases present in Redis
    lp:p:g:{G}:meta                           hash: computed_at, run_id, events, rows per view
    lp:p:g:{G}:{view}:z:{measure}[@{ws}]      sorted set: member = key, score = the measure's batch part
    lp:p:g:{G}:{view}:e:{measure}[@{ws}]      hash: key -> JSON array of a Distinct measure's values,
                                              for rows with at most EXACT_DISTINCT_MAX of them (batch part)
    lp:p:g:{G}:{view}:d:{measure}:{field}     HyperLogLog of a Distinct measure, for larger rows (batch part)
    lp:p:s:{B}:{view}:z:{measure}[@{ws}]      the same for the realtime segment based at B
    lp:p:s:{B}:{view}:d:{measure}:{field}
    lp:p:s:{B}:meta                           hash: processed (last master version fully applied)
    lp:p:guard:{query}                        hash: (view, partition, chunk) -> last micro-batch id applied
    lp:p:plan:{query}                         "batch id:bases" of the micro-batch in flight (replays reuse it)
    lp:p:speed                                hash: the speed layer's heartbeat and processed version
    lp:p:epoch                                random marker of this Redis dataset (gone: Redis lost its data)

A *key* is the view's key values joined by ``|``. Windowed views keep one sorted set per window
(``@`` and the window start in epoch seconds); a *field* (key, or key@ws) names one row of a
view. Sorted sets hold every scalar part (count, sum, min, max) and give exact top-N directly.
A batch row's distinct values are kept exactly while they are few (most rows of a fine-grained
view have a handful): one hash field per row, loaded many rows per command, instead of a
HyperLogLog key per row. Readers count them exactly, and fold them into a sketch only to merge
with HyperLogLogs. Realtime segments keep HyperLogLogs.
Everything of generation G lives under ``lp:p:g:{G}:``, of segment B under ``lp:p:s:{B}:``, so
each is loaded beside what is served and dropped whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.sql import Column
from pyspark.sql import functions as F

KEY_SEPARATOR = "|"
WINDOW_SEPARATOR = "@"
#: A batch row keeps its distinct values exactly up to this many; above it, as a HyperLogLog.
EXACT_DISTINCT_MAX = 64


def encode_key(key: Sequence[str] | str) -> str:
    """A key as one string. Composite keys join their values with '|', each value's '\\' and '|'
    escaped with '\\', so ("a|b", "c") and ("a", "b|c") stay apart; one-column keys are as they are."""
    if isinstance(key, str):
        return key
    if len(key) == 1:
        return key[0]
    return KEY_SEPARATOR.join(v.replace("\\", "\\\\").replace(KEY_SEPARATOR, "\\" + KEY_SEPARATOR) for v in key)


def suffix(window_start: int | None) -> str:
    """The per-window suffix of sorted-set names and fields ('' for all-time views)."""
    return "" if window_start is None else f"{WINDOW_SEPARATOR}{window_start}"


def encode_field(key: Sequence[str] | str, window_start: int | None = None) -> str:
    """The name of one view row: the key, then the window start for windowed views."""
    return encode_key(key) + suffix(window_start)


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

    @property
    def segments(self) -> str:
        return f"{self.prefix}:segments"

    @property
    def epoch(self) -> str:
        """Marker set once per Redis dataset: if it changes, Redis lost its data."""
        return f"{self.prefix}:epoch"

    @property
    def speed(self) -> str:
        return f"{self.prefix}:speed"

    def guard(self, query: str) -> str:
        return f"{self.prefix}:guard:{query}"

    def plan(self, query: str) -> str:
        """The current micro-batch's id and segment bases, kept so a replay reuses them."""
        return f"{self.prefix}:plan:{query}"

    def generation_prefix(self, generation: int) -> str:
        return f"{self.prefix}:g:{generation}"

    def segment_prefix(self, base: int) -> str:
        return f"{self.prefix}:s:{base}"

    def meta(self, generation: int) -> str:
        return f"{self.generation_prefix(generation)}:meta"

    def segment_meta(self, base: int) -> str:
        return f"{self.segment_prefix(base)}:meta"

    def scores(self, generation: int, view: str, measure: str, window_start: int | None = None) -> str:
        return f"{self.generation_prefix(generation)}:{view}:z:{measure}{suffix(window_start)}"

    def sketch(self, generation: int, view: str, measure: str, field: str) -> str:
        return f"{self.generation_prefix(generation)}:{view}:d:{measure}:{field}"

    def exact(self, generation: int, view: str, measure: str, window_start: int | None = None) -> str:
        """Hash of the rows' distinct values kept exactly (see ``EXACT_DISTINCT_MAX``)."""
        return f"{self.generation_prefix(generation)}:{view}:e:{measure}{suffix(window_start)}"
