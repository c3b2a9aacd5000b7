"""The Redis key layout of the serving store, shared by the layers that write it and the API that reads it.

For pipeline ``p`` (prefix ``lp:{p}``, its braces a Redis Cluster hash tag; written ``lp:p`` below),
batch generation ``G`` and realtime segment based at ``B`` (``{G}`` below is a placeholder, not a tag)::

    lp:p:current                              generation pointer: the master version G served
    lp:p:generations / lp:p:segments          sets of generations / segment bases present in Redis
    lp:p:g:{G}:meta                           hash: the generation's record (``serving.store.generation_meta``)
    lp:p:g:{G}:{view}:r[@{ws}]                hash: key -> the row's batch parts as a JSON array: scalar
                                              measures, then each distinct measure's values (an array of at
                                              most EXACT_DISTINCT_MAX), or null when kept as a HyperLogLog
    lp:p:g:{G}:{view}:d:{measure}:{field}     HyperLogLog of a distinct measure's values, for larger rows
    lp:p:g:{G}:{view}:k[@{ws}]                sorted set of the rows' keys, every score 0 (a lexicographic index
                                              for paging by key, ZRANGEBYLEX): built from the rows hash by the
                                              first key listing that needs it, like the rankings
    lp:p:g:{G}:{view}:z:{measure}[@{ws}]      sorted set ranking the rows by a scalar measure: built from the
                                              rows hash by the first top-N query that needs it
    lp:p:s:{B}:{view}:r[@{ws}]                realtime segment based at B: hash key -> the row's realtime parts,
                                              laid out as a batch row's (scores as strings, '' = none)
    lp:p:s:{B}:{view}:z:{measure}[@{ws}]      sorted set per scalar measure of the segment's rows (for top-N)
    lp:p:s:{B}:{view}:d:{measure}:{field}     realtime HyperLogLog of a distinct measure, for larger rows
    lp:p:s:{B}:{view}:u[@{ws}]                undo log of the micro-batch in flight: key -> the row's realtime
                                              field before it ('' = none)
    lp:p:s:{B}:{view}:t[@{ws}]                the undo log's tag: end version of the micro-batch that wrote it
    lp:p:s:{B}:{view}:c[@{ws}]                set of the :p: copies the undo log made (they go with it)
    lp:p:s:{B}:{view}:p:{measure}:{field}     a row's HyperLogLog before the micro-batch in flight touched it
    lp:p:s:{B}:logic                          the logic fingerprint (and speed query) segment B holds
    lp:p:s:{B}:meta                           hash: processed (last master version fully applied: the commit
                                              point; rows whose undo tag is above it read their undo value)
    lp:p:guard:{query}                        hash: (view, partition, chunk) -> last micro-batch id applied
    lp:p:plan:{query}                         "batch id:bases" of the micro-batch in flight (replays reuse it)
    lp:p:speed                                hash: the speed layer's heartbeat (``serving.store.heartbeat``)
    lp:p:kafka                                hash: the Kafka ingest's status (``serving.store.ingest_status``)
    lp:p:epoch                                random marker of this Redis dataset (gone: Redis lost its data)
    lp:p:batch:...                            the batch-run registry (``serving.store.runs`` documents it)

A *key* is the view's key values joined by ``|``. Windowed views keep one hash (and sorted set) per window (``@``
and the window start in epoch seconds); a *field* (key, or key@ws) names one row.

A row is one hash field holding all its parts (a read is one HGET), its distinct values exact up to
``row_format.EXACT_DISTINCT_MAX`` and a HyperLogLog above; sorted sets are built on first use (``serving.store.rankings``).
Everything of generation G lives under ``lp:p:g:{G}:``, of segment B under ``lp:p:s:{B}:``: loaded beside what is
served, dropped whole.
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

#: The Lua twins of the ``Keys`` names that scripts build per row (a script cannot ask Python); every script that
#: names a view's keys starts with this. ``vp`` is a generation's or segment's view prefix (``lp:p:g:{G}:{view}`` /
#: ``lp:p:s:{B}:{view}``); ``sfx`` a window suffix; ``field`` a row.
LUA_NAMES = """
local function generation_meta(p, g) return p .. ':g:' .. g .. ':meta' end
local function segment_meta(p, b) return p .. ':s:' .. b .. ':meta' end
local function generation_view(p, g, view) return p .. ':g:' .. g .. ':' .. view end
local function segment_view(p, b, view) return p .. ':s:' .. b .. ':' .. view end
local function rows_key(vp, sfx) return vp .. ':r' .. sfx end
local function index_key(vp, sfx) return vp .. ':k' .. sfx end
local function scores_key(vp, measure, sfx) return vp .. ':z:' .. measure .. sfx end
local function sketch_key(vp, measure, field) return vp .. ':d:' .. measure .. ':' .. field end
local function undo_key(vp, sfx) return vp .. ':u' .. sfx end
local function undo_tag_key(vp, sfx) return vp .. ':t' .. sfx end
local function undo_copies_key(vp, sfx) return vp .. ':c' .. sfx end
local function previous_key(vp, measure, field) return vp .. ':p:' .. measure .. ':' .. field end
local function scratch_key(p) return p .. ':scratch' end
local function top_seen_key(p, token) return p .. ':scratch:top:' .. token end
"""

#: The Lua twins of the batch-run registry's names; ``P`` is ``Keys.batch_prefix`` (``lp:p:batch``).
LUA_RUN_NAMES = """
local function run_key(P, id) return P .. ':run:' .. id end
local function runs_key(P) return P .. ':runs' end
local function queue_key(P) return P .. ':queue' end
local function lease_key(P) return P .. ':lease' end
local function active_key(P) return P .. ':active' end
"""

KEY_SEPARATOR = "|"
WINDOW_SEPARATOR = "@"


def encode_key(key: Sequence[str] | str) -> str:
    """A key as one string. Composite keys join their values with '|', each value's '\\' and '|'
    escaped with '\\', so ("a|b", "c") and ("a", "b|c") stay apart; one-column keys are as they are."""
    if isinstance(key, str):
        return key
    if len(key) == 1:
        return key[0]
    return KEY_SEPARATOR.join(v.replace("\\", "\\\\").replace(KEY_SEPARATOR, "\\" + KEY_SEPARATOR) for v in key)


def decode_key(key: str, columns: int) -> tuple[str, ...]:
    """The key column values of an encoded key (``encode_key`` undone) for a view of ``columns`` key columns.
    Raises ValueError when ``key`` does not hold that many values."""
    if columns == 1:
        return (key,)
    values, current, escaped = [], [], False
    for ch in key:
        if escaped:
            current.append(ch)
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == KEY_SEPARATOR:
            values.append("".join(current))
            current = []
        else:
            current.append(ch)
    values.append("".join(current))
    if escaped or len(values) != columns:
        raise ValueError(f"{key!r} is not an encoded key of {columns} columns")
    return tuple(values)


def suffix(window_start: int | None) -> str:
    """The per-window suffix of sorted-set names and fields ('' for all-time views)."""
    return "" if window_start is None else f"{WINDOW_SEPARATOR}{window_start}"


def encode_field(key: Sequence[str] | str, window_start: int | None = None) -> str:
    """The name of one view row: the key, then the window start for windowed views."""
    return encode_key(key) + suffix(window_start)


@dataclass(frozen=True)
class Keys:
    """Key names for one pipeline's views in Redis.

    Every name carries a Redis Cluster hash tag, so the keys one Lua call touches share a slot: ``lp:{p}``
    for what is global to the pipeline (pointer, epoch marker, speed heartbeat, batch-run registry) and,
    with ``buckets`` > 1, ``lp:{p.b}`` for bucket ``b`` (named by ``bucket(b)``, same methods): its share
    of every generation and segment (the rows whose key hashes to ``b``, ``bucket_of``), with its own
    pointer and epoch marker. With one bucket, bucket 0 *is* the global prefix (the layout above).
    """

    pipeline: str
    namespace: str = "lp"
    #: How many slot buckets rows are spread over (1 on a single Redis).
    buckets: int = 1
    #: None: the pipeline's global keys; else the bucket these names are in.
    bucket_index: int | None = None

    def __post_init__(self) -> None:
        if self.buckets < 1:
            raise ValueError(f"buckets must be at least 1, not {self.buckets}")
        if self.bucket_index is not None and not 0 <= self.bucket_index < self.buckets:
            raise ValueError(f"bucket {self.bucket_index} is outside 0..{self.buckets - 1}")

    @property
    def prefix(self) -> str:
        if self.bucket_index is None or self.buckets == 1:
            return f"{self.namespace}:{{{self.pipeline}}}"
        return f"{self.namespace}:{{{self.pipeline}.{self.bucket_index}}}"

    @property
    def is_global(self) -> bool:
        """True when these names are the global ones (also bucket 0 of a single-bucket layout)."""
        return self.bucket_index is None or self.buckets == 1

    def bucket(self, index: int) -> Keys:
        """The names of bucket ``index`` (one slot: a Lua call may touch any of them together).
        Cached: publishing asks for a row's bucket once per row."""
        return _bucket(self, index)

    def all_buckets(self) -> Iterator[Keys]:
        return (self.bucket(b) for b in range(self.buckets))

    @property
    def global_keys(self) -> Keys:
        """The pipeline's global names (these names, if they are not a bucket's)."""
        return replace(self, bucket_index=None) if self.bucket_index is not None else self

    def every_prefix(self) -> list[Keys]:
        """Every prefix the pipeline's keys live under: the global one, then each bucket's when bucketed
        (with one bucket, bucket 0 *is* the global prefix)."""
        glob = self.global_keys
        return [glob] if self.buckets == 1 else [glob, *glob.all_buckets()]

    def bucket_of(self, key: str) -> int:
        """The bucket of a row, by its key (not its window: all windows of a key share a bucket, so a
        range read is one call). CRC-32, the same in every process (Python's hash() is salted)."""
        return zlib.crc32(key.encode()) % self.buckets if self.buckets > 1 else 0

    def for_key(self, key: str) -> Keys:
        """The names of the bucket that holds ``key``'s rows."""
        return self.bucket(self.bucket_of(key))

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
    def layout(self) -> str:
        """How many buckets the store was laid out with (set once, checked by every writer)."""
        return f"{self.prefix}:buckets"

    @property
    def speed(self) -> str:
        return f"{self.prefix}:speed"

    @property
    def kafka(self) -> str:
        return f"{self.prefix}:kafka"

    @property
    def query_state_prefixes(self) -> tuple[str, ...]:
        """Prefixes of everything a speed-layer query keeps: its segments, guards and plans (a fresh start drops them)."""
        return (f"{self.prefix}:s", *self.query_position_prefixes)

    @property
    def query_position_prefixes(self) -> tuple[str, ...]:
        """Prefixes of where speed-layer queries are: guards and plans (a new query drops them, not the segments)."""
        return f"{self.prefix}:guard", f"{self.prefix}:plan"

    def guard(self, query: str) -> str:
        return f"{self.prefix}:guard:{query}"

    def plan(self, query: str) -> str:
        """The current micro-batch's id and segment bases, kept so a replay reuses them."""
        return f"{self.prefix}:plan:{query}"

    def generation_prefix(self, generation: int) -> str:
        return f"{self.prefix}:g:{generation}"

    def segment_prefix(self, base: int) -> str:
        return f"{self.prefix}:s:{base}"

    def view_prefix(self, generation: int, view: str) -> str:
        return f"{self.generation_prefix(generation)}:{view}"

    def segment_view_prefix(self, base: int, view: str) -> str:
        return f"{self.segment_prefix(base)}:{view}"

    @property
    def segment_metas(self) -> str:
        """Pattern matching every segment's meta hash (for SCAN)."""
        return f"{self.prefix}:s:*:meta"

    def segment_logic(self, base: int) -> str:
        """The logic segment ``base`` is claimed for (``serving.store.logic``); global keys only."""
        return f"{self.prefix}:s:{base}:logic"

    @property
    def scratch(self) -> str:
        """Scratch HyperLogLog of readers' scripts (never persisted)."""
        return f"{self.prefix}:scratch"

    def top_seen(self, token: str) -> str:
        """The keys a top-N over panes met so far, between its calls (``serving.store.range_top``; expires)."""
        return f"{self.prefix}:scratch:top:{token}"

    def meta(self, generation: int) -> str:
        return f"{self.generation_prefix(generation)}:meta"

    def segment_meta(self, base: int) -> str:
        return f"{self.segment_prefix(base)}:meta"

    def scores(self, generation: int, view: str, measure: str, window_start: int | None = None) -> str:
        return f"{self.view_prefix(generation, view)}:z:{measure}{suffix(window_start)}"

    def sketch(self, generation: int, view: str, measure: str, field: str) -> str:
        return f"{self.view_prefix(generation, view)}:d:{measure}:{field}"

    def segment_scores(self, base: int, view: str, measure: str, window_start: int | None = None) -> str:
        return f"{self.segment_view_prefix(base, view)}:z:{measure}{suffix(window_start)}"

    def segment_rows(self, base: int, view: str, window_start: int | None = None) -> str:
        """Hash of a realtime segment's rows (of one window): key -> JSON array of the parts, as ``rows``."""
        return f"{self.segment_view_prefix(base, view)}:r{suffix(window_start)}"

    def segment_sketch(self, base: int, view: str, measure: str, field: str) -> str:
        return f"{self.segment_view_prefix(base, view)}:d:{measure}:{field}"

    def segment_undo(self, base: int, view: str, window_start: int | None = None) -> str:
        """Hash: key -> its row's parts before the micro-batch named by ``segment_undo_tag`` first touched it."""
        return f"{self.segment_view_prefix(base, view)}:u{suffix(window_start)}"

    def segment_undo_tag(self, base: int, view: str, window_start: int | None = None) -> str:
        """The end version of the micro-batch whose undo values ``segment_undo`` holds."""
        return f"{self.segment_view_prefix(base, view)}:t{suffix(window_start)}"

    def segment_undo_copies(self, base: int, view: str, window_start: int | None = None) -> str:
        """Set of the ``segment_previous`` sketches ``segment_undo`` saved (dropped with it)."""
        return f"{self.segment_view_prefix(base, view)}:c{suffix(window_start)}"

    def segment_previous(self, base: int, view: str, measure: str, field: str) -> str:
        """A row's distinct-measure sketch as it was before the micro-batch in flight first touched it."""
        return f"{self.segment_view_prefix(base, view)}:p:{measure}:{field}"

    def key_index(self, generation: int, view: str, window_start: int | None = None) -> str:
        """Sorted set of a generation's row keys (of one window), all scored 0: ordered by key, bytewise."""
        return f"{self.view_prefix(generation, view)}:k{suffix(window_start)}"

    def rows(self, generation: int, view: str, window_start: int | None = None) -> str:
        """Hash of a generation's rows (of one window): key -> JSON array of the parts, in ``row_parts`` order."""
        return f"{self.view_prefix(generation, view)}:r{suffix(window_start)}"

    # -- the batch-run registry (``serving.store.runs``); Lua twins in LUA_RUN_NAMES ---------------------
    @property
    def batch_prefix(self) -> str:
        return f"{self.prefix}:batch"

    def batch_run(self, run_id: str) -> str:
        """Hash: one run's record."""
        return f"{self.batch_prefix}:run:{run_id}"

    @property
    def batch_runs(self) -> str:
        """Sorted set: run ids scored by the time each was asked for."""
        return f"{self.batch_prefix}:runs"

    @property
    def batch_queue(self) -> str:
        return f"{self.batch_prefix}:queue"

    @property
    def batch_lease(self) -> str:
        return f"{self.batch_prefix}:lease"

    @property
    def batch_active(self) -> str:
        return f"{self.batch_prefix}:active"

    @property
    def batch_schedulers(self) -> str:
        return f"{self.batch_prefix}:schedulers"

    def batch_scheduler(self, owner: str) -> str:
        return f"{self.batch_prefix}:scheduler:{owner}"

@functools.lru_cache(maxsize=4096)
def _bucket(keys: Keys, index: int) -> Keys:
    return replace(keys, bucket_index=index)
