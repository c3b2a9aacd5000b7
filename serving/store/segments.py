"""Realtime segments: their write protocol (guarded, undo-logged chunk calls), their index and its reset.

The speed layer merges a micro-batch's increments into rows (``speed_layer.segments``); this module
owns what the rows become in Redis. Each chunk is one Lua call (``apply_chunk``) that first checks
a guard, the highest micro-batch id applied for (view, part, chunk) under the query: a replayed
micro-batch cuts the same chunks, so the guard makes a replay a no-op. The call skips segments
below the served generation (dead) and refuses to write under another epoch (Redis lost its data).

**A micro-batch becomes visible at once.** Before a call first changes a row in a micro-batch it
saves the row's field in the window's *undo log* (``:u``, '' = none), tagged (``:t``) with the
micro-batch's end version; a sketch it had is COPYed to ``:p:`` and listed in ``:c``. A call that
finds an older tag starts the log over (that micro-batch is committed: they run one after another).
A key already in the log was saved earlier in this micro-batch and keeps its saved value; the write
order (a row's increments contiguous, in one part) means only a call's first row can be one, unless
the micro-batch continues one left uncommitted (same tag), when every key is looked up. The commit
(``serving.store.segment_commits``) sets each segment's ``processed`` to the tag; a reader
(``serving.store.read_scripts``) takes ``processed`` and, where a window's tag is above it, the
saved values, in one call: an answer is exactly the state at ``processed``.

**Rows are merged by the writer, checked and stored by Redis.** A call carries the rows' new fields
and a digest of the fields they were merged from; it refuses the whole chunk (``ROWS_CHANGED``) if
any changed, and the writer reads and merges again.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple, Protocol

import redis
from redis.commands.core import Script

from batch_layer.faults import fault_point
from serving.store.generations import delete_prefix, epoch_marker, served_generation
from serving.store.keys import LUA_NAMES, Keys, suffix

#: The layout realtime segments are written in (a speed-layer checkpoint records it; one of another
#: layout starts over, rebuilding the segments). 2: a hash field per row (before: a HyperLogLog per row).
SEGMENT_LAYOUT = 2

#: Rows per guarded call at most: ZADD takes 2 arguments per row and Lua's unpack() stops near 8000
#: (lists that grow with the distinct measures too, the sketch copies, go in slices).
MAX_CHUNK_ROWS = 3_000

#: ``apply_chunk``'s replies besides applied (1) and skipped by the guard (0).
EPOCH_CHANGED, ROWS_CHANGED = -1, -2

# KEYS: current pointer, guard hash, epoch. ARGV: prefix, view, guard field, batch id, epoch, tag (the
# micro-batch's end version), whether it continues the undo logs of a micro-batch left uncommitted ('1':
# any key may be saved already, each is looked up; '0': only the first), n scalar measures, their
# names..., n distinct measures, their names... (a session view's rows: 0 and 0, ``SESSION_ROWS``: the
# field alone, no score column, no sketch), the chunk's first key and window suffix, n windows; then per window: segment base, window suffix,
# n rows, digest of the rows merged from, then columns of n: keys, new row fields, one column of new
# scores per scalar measure ('' = unchanged; 'inf' for an overflowed sum, a score Redis takes, never NaN);
# then per distinct measure the rows (1-based) whose sketch existed before (n, indexes...); then per
# distinct measure the rows with values for their sketches (n, then key, n values, values... of each).
# The call checks that every window's rows are still the ones the caller merged from (their digest:
# SHA-1 of the fields joined by '\n', '' for a row absent) before it writes anything, and answers -2
# if not: the caller reads and merges again. No two writers should touch a row at once (a row is in
# one partition, whose chunks are applied in order, and guarded); the digest makes that a check
# rather than an assumption about Spark's scheduling. Windows of dead segments are skipped. A
# chunk holds at most MAX_CHUNK_ROWS rows so no unpack() exceeds Lua's stack: a script that fails
# midway would leave partial writes that Redis does not roll back.
_APPLY = LUA_NAMES + """
if redis.call('GET', KEYS[3]) ~= ARGV[5] then return -1 end
local batch = tonumber(ARGV[4])
if batch <= tonumber(redis.call('HGET', KEYS[2], ARGV[3]) or '-1') then return 0 end
local current = tonumber(redis.call('GET', KEYS[1]) or '-1')
local p, view, tag = ARGV[1], ARGV[2], ARGV[6]
local continues = ARGV[7] == '1'
local i = 8
local nm = tonumber(ARGV[i]); local names = {}
for j = 1, nm do names[j] = ARGV[i + j] end
i = i + nm + 1
local nd = tonumber(ARGV[i]); local dnames = {}
for j = 1, nd do dnames[j] = ARGV[i + j] end
i = i + nd + 1
local first_key, first_sfx, nw = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
i = i + 3
-- Read every window's layout and check its rows before anything is written.
local windows = {}
for _ = 1, nw do
  local base, sfx, n, digest = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2]), ARGV[i + 3]
  local w = {sp = segment_view(p, base, view), sfx = sfx, n = n, K = i + 3, R = i + 3 + n, S = i + 3 + 2 * n}
  i = w.S + nm * n + 1
  w.sketched = {}
  for j = 1, nd do
    local c, set = tonumber(ARGV[i]), {}
    for t = 1, c do set[tonumber(ARGV[i + t])] = true end
    w.sketched[j] = set
    i = i + c + 1
  end
  w.adds = {}
  for j = 1, nd do
    local list, m = {}, tonumber(ARGV[i])
    i = i + 1
    for _ = 1, m do
      local c = tonumber(ARGV[i + 1])
      list[#list + 1] = {key = ARGV[i], at = i + 2, count = c}
      i = i + 2 + c
    end
    w.adds[j] = list
  end
  if tonumber(base) >= current then
    w.keys = {unpack(ARGV, w.K + 1, w.K + n)}
    w.olds = redis.call('HMGET', rows_key(w.sp, sfx), unpack(w.keys))
    local seen = {}
    for q = 1, n do seen[q] = w.olds[q] or '' end
    if redis.sha1hex(table.concat(seen, '\\n')) ~= digest then return -2 end
    windows[#windows + 1] = w
  end
end
-- The undo log of window `sfx` of segment view `sp` for this micro-batch, and whether it is new (then
-- nothing in it is saved yet). One an earlier micro-batch left is obsolete (that one is committed): it
-- starts over, and the sketches it copied go with it.
local function undo_log(sp, sfx)
  local u, t = undo_key(sp, sfx), undo_tag_key(sp, sfx)
  if redis.call('GET', t) == tag then return u, false end
  local c = undo_copies_key(sp, sfx)
  local stale = redis.call('SMEMBERS', c)
  for q = 1, #stale, 1000 do redis.call('UNLINK', unpack(stale, q, math.min(q + 999, #stale))) end
  redis.call('DEL', u, c)
  redis.call('SET', t, tag)
  return u, true
end
local function each_slice(list, f)
  for q = 1, #list, 1000 do f(unpack(list, q, math.min(q + 999, #list))) end
end
for _, w in ipairs(windows) do
  local sp, sfx, n, keys = w.sp, w.sfx, w.n, w.keys
  local rk = rows_key(sp, sfx)
  -- Save each row as it was before this micro-batch first changes it ('' = none), and a sketch it had.
  -- A key this log already holds was saved by an earlier call of this micro-batch: a row's increments
  -- are contiguous in the chunks' order and in one partition, so only the chunk's first row can be one
  -- (any row, when the micro-batch continues one left uncommitted).
  local u, fresh = undo_log(sp, sfx)
  local kept = {}
  if not fresh and continues then  -- the micro-batch left uncommitted may have saved any of them
    local have = redis.call('HMGET', u, unpack(keys))
    for q = 1, n do if have[q] then kept[keys[q]] = true end end
  elseif not fresh and sfx == first_sfx and redis.call('HEXISTS', u, first_key) == 1 then
    kept[first_key] = true
  end
  local saves, copies, written = {}, {}, {}
  for q = 1, n do
    local key = keys[q]
    if not kept[key] then
      saves[#saves + 1] = key; saves[#saves + 1] = w.olds[q] or ''
      for j = 1, nd do
        if w.sketched[j][q] then
          local before = previous_key(sp, dnames[j], key .. sfx)
          redis.call('COPY', sketch_key(sp, dnames[j], key .. sfx), before, 'REPLACE')
          copies[#copies + 1] = before
        end
      end
    end
    written[#written + 1] = key; written[#written + 1] = ARGV[w.R + q]
  end
  each_slice(saves, function(...) redis.call('HSET', u, ...) end)
  each_slice(copies, function(...) redis.call('SADD', undo_copies_key(sp, sfx), ...) end)
  each_slice(written, function(...) redis.call('HSET', rk, ...) end)
  -- The rankings top-N merges: one sorted set per scalar measure.
  for j = 1, nm do
    local args, col = {}, w.S + (j - 1) * n
    for q = 1, n do
      local s = ARGV[col + q]
      if s ~= '' then args[#args + 1] = s; args[#args + 1] = keys[q] end
    end
    each_slice(args, function(...) redis.call('ZADD', scores_key(sp, names[j], sfx), ...) end)
  end
  for j = 1, nd do
    for _, a in ipairs(w.adds[j]) do
      local hll = sketch_key(sp, dnames[j], a.key .. sfx)
      for s = a.at, a.at + a.count - 1, 1000 do
        redis.call('PFADD', hll, unpack(ARGV, s, math.min(s + 999, a.at + a.count - 1)))
      end
    end
  end
end
redis.call('HSET', KEYS[2], ARGV[3], batch)
return 1
"""


class RowLayout(NamedTuple):
    """What a view's realtime rows carry beside their hash field, by the view's kind: a measure view's scalar
    measures (a sorted set each, so a score per row and call) and distinct measures (a sketch each); a session
    view's row is its key's session part alone (``SESSION_ROWS``: no score, no sketch)."""

    scalars: tuple[str, ...] = ()
    distinct: tuple[str, ...] = ()
    sessions: bool = False


#: The layout of a session view's rows (``shared_logic.session_parts``): the part, nothing beside it.
SESSION_ROWS = RowLayout(sessions=True)


class MergedRow(Protocol):
    """One row's new value and what its write needs beside the hash field (``speed_layer.realtime_rows``)."""

    row: bytes
    #: Per scalar measure, the new score ('' = unchanged).
    scores: list[str]
    #: Per distinct measure, whether its sketch existed before (it is saved in the undo log).
    sketched: list[bool]
    #: Per distinct measure, the values to add to its sketch.
    sketch_adds: list[list[str]]


class WindowWrite(NamedTuple):
    """A chunk's rows in one (segment, window): their keys, their fields as read, and their merged values."""

    base: int
    start: int | None
    keys: list[str]
    olds: list[bytes | None]
    merged: list[MergedRow]


class MicroBatchWrite(NamedTuple):
    """What every call of one micro-batch carries: guarded under ``query`` as ``batch_id``, refused under another
    ``epoch`` (the store's, as ``PipelineStore.ensure_epoch`` gave it), tagged ``tag``; ``continues``: the undo
    logs are those of a micro-batch left uncommitted under the same tag."""

    query: str
    batch_id: int
    epoch: str
    tag: int
    continues: bool


def apply_script(client: redis.Redis) -> Script:
    """The chunk script registered on ``client`` (register once per writer: calls then send its SHA)."""
    return client.register_script(_APPLY)


def read_rows(client: redis.Redis, bucket: Keys, view: str,
              windows: Mapping[tuple[int, int | None], Iterable[str]]) -> list[list[bytes | None]]:
    """The fields the keys of each (segment base, window start) hold now, in one round trip, in ``windows``' order."""
    read = client.pipeline(transaction=False)
    for (base, start), keys in windows.items():
        read.hmget(bucket.segment_rows(base, view, start), list(keys))
    return read.execute()


def apply_chunk(script: Script, bucket: Keys, batch: MicroBatchWrite, view: str, guard: str, layout: RowLayout,
                windows: Sequence[WindowWrite]) -> int:
    """Write one chunk of ``view`` (all its rows in ``bucket``) in one atomic call guarded as ``guard``.

    ``layout``: what the view's rows carry (a session view's: ``SESSION_ROWS``, its rows' merges must then carry
    no score or sketch: ValueError); ``windows`` in the order the rows came, the chunk's first row first. Returns
    1 (applied), 0 (applied before: a replay), ``EPOCH_CHANGED`` (nothing written) or ``ROWS_CHANGED`` (nothing
    written; read and merge again).
    """
    if layout.sessions and (layout.scalars or layout.distinct or any(
            m.scores or m.sketched or m.sketch_adds for w in windows for m in w.merged)):
        raise ValueError(f"a session view's rows carry their part alone, no score or sketch (view {view!r})")
    args = _call_args(bucket, batch, view, guard, layout, windows)
    return int(script(keys=[bucket.current, bucket.guard(batch.query), bucket.epoch], args=args))


def _call_args(bucket: Keys, batch: MicroBatchWrite, view: str, guard: str, layout: RowLayout,
               windows: Sequence[WindowWrite]) -> list:
    """APPLY's ARGV (laid out in the comment above ``_APPLY``)."""
    scalars, distinct = layout.scalars, layout.distinct
    first = windows[0]  # its first key is the chunk's first row: the one a chunk boundary may have cut
    args: list = [bucket.prefix, view, guard, batch.batch_id, epoch_marker(bucket, batch.epoch), batch.tag,
                  "1" if batch.continues else "0", len(scalars), *scalars, len(distinct), *distinct,
                  first.keys[0], suffix(first.start), len(windows)]
    for w in windows:
        merged = w.merged
        digest = hashlib.sha1(b"\n".join(_as_bytes(b) for b in w.olds)).hexdigest()
        args += [w.base, suffix(w.start), len(w.keys), digest, *w.keys, *(m.row for m in merged)]
        for j in range(len(scalars)):
            args += [m.scores[j] for m in merged]
        for j in range(len(distinct)):
            sketched = [q for q, m in enumerate(merged, 1) if m.sketched[j]]
            args += [len(sketched), *sketched]
        for j in range(len(distinct)):
            adds = [(key, m.sketch_adds[j]) for key, m in zip(w.keys, merged) if m.sketch_adds[j]]
            args.append(len(adds))
            for key, values in adds:
                args += [key, len(values), *values]
    return args


def _as_bytes(field: bytes | str | None) -> bytes:
    return field.encode() if isinstance(field, str) else field or b""


class Segments:
    """One pipeline's realtime segments in one Redis, as the speed layer's driver keeps them
    (``PipelineStore.segments``): their index (the bases of live segments) and their reset. Their rows go
    through ``apply_chunk``."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.client, self.keys = client, keys.global_keys

    def register(self, bases: Sequence[int]) -> None:
        """Add segments based at ``bases`` (barriers the speed layer met) to the index."""
        self.client.sadd(self.keys.segments, *bases)

    def live(self, barriers: Sequence[int]) -> list[int]:
        """The bases of the live segments, ascending: the served generation's and every indexed base (and
        ``barriers``) above it; every indexed base (and ``barriers``) while none is served."""
        served = served_generation(self.client, self.keys)
        known = {int(b) for b in self.client.smembers(self.keys.segments)} | set(barriers)
        if served is not None:
            known.add(served)
        return sorted(b for b in known if served is None or b >= served)

    def reset(self, served: int) -> None:
        """Forget every realtime segment and every query's guards and plans; ``served``'s is then the one live
        segment, empty (a fresh query rebuilds it from ``served`` on).

        Metadata first: readers read nothing of a segment without its processed version
        (``serving.store.read_scripts``), so while the rest goes answers are the generation's alone, never
        a processed version over half-deleted data.
        """
        self.client.delete(self.keys.segments)
        for bucket in self.keys.every_prefix():
            for key in self.client.scan_iter(match=bucket.segment_metas):
                self.client.unlink(key)
        fault_point("speed-dropping-segments")  # metadata gone, data not yet
        for bucket in self.keys.every_prefix():
            for prefix in bucket.query_state_prefixes:
                delete_prefix(self.client, prefix)
        self.client.sadd(self.keys.segments, served)

    def forget_queries(self) -> None:
        """Drop every query's guards and plans (a new query starts; the segments stay)."""
        for bucket in self.keys.every_prefix():
            for prefix in bucket.query_position_prefixes:
                delete_prefix(self.client, prefix)
