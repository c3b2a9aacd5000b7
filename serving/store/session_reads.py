"""Reads of session views (``shared_logic.sessions``), each atomic: a key's parts, or every key's.

A session view's row is its key's session part (JSON, ``shared_logic.session_parts.encode_part``), one in the
generation's rows hash and one, merged by the speed layer's writer, in the realtime segment's (the same
undo-logged rows as every view: a row a micro-batch not yet committed has changed reads as saved before
it). These scripts hand both back as they are; the caller merges them with the one session merge
(``merge_parts``): Lua never decodes a session.

**Top-N cost.** A key's session count or longest session in a range is not a monoid of per-pane parts
(a late event can bridge two sessions, lowering the count), so no ranking or threshold merge bounds the
read: a top-N reads every key's two rows of the view, one call per bucket (atomic in its bucket; the
buckets agree on one generation and version, as every top-N), and ranks them in the API process: exact,
at O(keys x sessions per key) read and merged per request. Two bounds keep one call from blocking Redis
or flooding the API (a row at ``max_sessions`` = 1000 with four measures is about 50 KB): ``max_keys`` rows
a bucket (``HLEN``, before anything is read) and ``max_bytes`` bytes over all buckets, each call its share:
the call reads its rows with ``HSCAN`` and stops as soon as the bytes read pass its share, so its work and
reply stay within it. Past either the top-N is refused (``TopTooLargeError``, a 422 naming the setting)
rather than blocking Redis; at most ``TOPS_AT_ONCE`` top-Ns of one API process read and merge at once, and
one asks the buckets again at most ``_CONSISTENT_TRIES`` times when a commit lands between their calls.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from serving.store.errors import StoreError
from serving.store.keys import Keys
from serving.store.read_scripts import HEADER
from serving.store.reader import ServingStore
from serving.store.reads import Generation

# ARGV: prefix, view, key. The key's batch row and committed realtime row ('' = none), raw.
_KEY = HEADER + """
local key = ARGV[3]
local batch = redis.call('HGET', rows_key(bp, ''), key) or ''
if uncommitted(sp, '') then
  local saved = redis.call('HGET', undo_key(sp, ''), key)
  if saved then return {generation, processed, meta, batch, saved} end
end
return {generation, processed, meta, batch, redis.call('HGET', rows_key(sp, ''), key) or ''}
"""

# ARGV: prefix, view, most rows, most bytes. Every batch row (key, row...) and committed realtime row (key, row...;
# '' = none) of the bucket; {generation, processed, meta, 'too many', rows} past the most rows (nothing read), or
# {generation, processed, meta, 'too big', bytes} as soon as the keys and rows read pass the most bytes.
_ALL = HEADER + """
local rows = redis.call('HLEN', rows_key(bp, '')) + redis.call('HLEN', rows_key(sp, ''))
if rows > tonumber(ARGV[3]) then return {generation, processed, meta, 'too many', rows} end
local budget, used = tonumber(ARGV[4]), 0
local function scan(hash)  -- the hash's fields and values, flat; nil once the bytes read pass the budget
  local out, cursor = {}, '0'
  repeat
    local page = redis.call('HSCAN', hash, cursor, 'COUNT', 128)
    cursor = page[1]
    local items = page[2]
    for t = 1, #items, 2 do
      used = used + #items[t] + #items[t + 1]
      if used > budget then return nil end
      out[#out + 1] = items[t]
      out[#out + 1] = items[t + 1]
    end
  until cursor == '0'
  return out
end
local batch = scan(rows_key(bp, ''))
local realtime = batch and scan(rows_key(sp, ''))
if not realtime then return {generation, processed, meta, 'too big', used} end
if uncommitted(sp, '') then
  local undo = undo_key(sp, '')
  for t = 1, #realtime, 2 do
    local before = redis.call('HGET', undo, realtime[t])
    if before then
      used = used + #before
      if used > budget then return {generation, processed, meta, 'too big', used} end
      realtime[t + 1] = before
    end
  end
end
return {generation, processed, meta, batch, realtime}
"""

#: Session top-Ns one API process reads and merges at once (each holds up to ``max_bytes`` of rows).
TOPS_AT_ONCE = 2
#: How often a session top-N reads every bucket again when they answered at different versions (each
#: round reads up to ``max_bytes``; the store's other top-Ns, whose rounds are small, try more).
_CONSISTENT_TRIES = 5


class TopTooLargeError(StoreError):
    """A session top-N would read more rows or bytes than its bounds (``SessionReads.max_keys``, ``max_bytes``)."""


@dataclass(frozen=True)
class SessionRows:
    """Raw session parts at the version ``generation`` names: key -> (batch row, realtime row), b'' = none."""

    generation: Generation
    rows: dict[str, tuple[bytes, bytes]]


class SessionReads:
    """Atomic reads of a session view's parts through ``store`` (its checks: generation, view, versions).
    ``tops``: held by a session top-N while it reads and merges (``TOPS_AT_ONCE``)."""

    def __init__(self, store: ServingStore, max_keys: int, max_bytes: int) -> None:
        self.store, self.max_keys, self.max_bytes = store, max_keys, max_bytes
        self.tops = asyncio.Semaphore(TOPS_AT_ONCE)
        self._key = store.register(_KEY)
        self._all = store.register(_ALL)

    async def key(self, view: str, key: str) -> SessionRows:
        """``key``'s batch and realtime parts of ``view``, in one call."""
        bucket = self.store.keys.for_key(key)
        generation, processed, meta, batch, realtime = await self.store.call(self._key, bucket, [bucket.prefix, view, key])
        rows = {key: (batch, realtime)} if batch or realtime else {}
        return SessionRows(self.store.served(view, generation, processed, meta), rows)

    async def every_key(self, view: str) -> SessionRows:
        """Every key's parts of ``view``, all buckets at one generation and version. TopTooLargeError past
        ``max_keys`` rows in a bucket or past ``max_bytes`` read (each bucket's call its share)."""
        buckets = list(self.store.keys.all_buckets())
        share = max(1, self.max_bytes // len(buckets))
        replies = await self.store.consistent(
            view, lambda: asyncio.gather(*(self._bucket(b, view, share) for b in buckets)), _CONSISTENT_TRIES)
        rows: dict[str, tuple[bytes, bytes]] = {}
        for reply in replies:
            if reply[3] == b"too many":
                raise TopTooLargeError(
                    f"view {view!r} holds {int(reply[4]):,} rows in one part of the store, more than a session top-N "
                    f"reads ({self.max_keys:,}, LAMBDA_MAX_SESSION_TOP_KEYS): ask for a key's sessions instead")
            if reply[3] == b"too big":
                raise TopTooLargeError(
                    f"view {view!r}: a session top-N would read more than {self.max_bytes:,} bytes of session rows "
                    f"(LAMBDA_SESSION_TOP_BYTES; {share:,} from each of {len(buckets)} part(s) of the store): ask for a "
                    "key's sessions instead, or raise LAMBDA_SESSION_TOP_BYTES (each top-N then holds Redis and the "
                    "API longer)")
            _collect(rows, reply[3], 0)
            _collect(rows, reply[4], 1)
        return SessionRows(self.store.served(view, *replies[0][:3]), rows)

    async def _bucket(self, bucket: Keys, view: str, share: int) -> list:
        return await self.store.call(self._all, bucket, [bucket.prefix, view, self.max_keys, share])


def _collect(rows: dict[str, tuple[bytes, bytes]], flat: list, side: int) -> None:
    """Add a flat (key, row...) reply as the ``side`` (0 batch, 1 realtime) of each key's rows."""
    for t in range(0, len(flat), 2):
        key, row = flat[t].decode(), flat[t + 1]
        have = rows.get(key, (b"", b""))
        rows[key] = (row, have[1]) if side == 0 else (have[0], row)
