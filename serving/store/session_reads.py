"""Reads of session views (``shared_logic.sessions``), each atomic: a key's parts, or every key's.

A session view's row is its key's session part (JSON, ``shared_logic.sessions.encode_part``), one in the
generation's rows hash and one, merged by the speed layer's writer, in the realtime segment's (the same
undo-logged rows as every view: a row a micro-batch not yet committed has changed reads as saved before
it). These scripts hand both back as they are; the caller merges them with the one session merge
(``merge_parts``): Lua never decodes a session.

**Top-N cost.** A key's session count or longest session in a range is not a monoid of per-pane parts
(a late event can bridge two sessions, lowering the count), so no ranking or threshold merge bounds the
read: a top-N reads every key's two rows of the view, one call per bucket (atomic in its bucket; the
buckets agree on one generation and version, as every top-N), and ranks them in the API process: exact,
at O(keys x sessions per key) read and merged per request. ``max_keys`` bounds it: a view with more rows
than that is refused (``TooManyKeysError``) rather than blocking Redis for long.
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

# ARGV: prefix, view, most rows. Every batch row (key, row...) and committed realtime row (key, row...; '' =
# none) of the bucket, or {generation, processed, meta, 'too many', rows} past the most.
_ALL = HEADER + """
local rows = redis.call('HLEN', rows_key(bp, '')) + redis.call('HLEN', rows_key(sp, ''))
if rows > tonumber(ARGV[3]) then return {generation, processed, meta, 'too many', rows} end
local realtime = redis.call('HGETALL', rows_key(sp, ''))
if uncommitted(sp, '') then
  local undo = redis.call('HGETALL', undo_key(sp, ''))
  local saved = {}
  for t = 1, #undo, 2 do saved[undo[t]] = undo[t + 1] end
  for t = 1, #realtime, 2 do
    local before = saved[realtime[t]]
    if before then realtime[t + 1] = before end
  end
end
return {generation, processed, meta, redis.call('HGETALL', rows_key(bp, '')), realtime}
"""


class TooManyKeysError(StoreError):
    """A session top-N would read more rows than its bound (``SessionReads.max_keys``)."""


@dataclass(frozen=True)
class SessionRows:
    """Raw session parts at the version ``generation`` names: key -> (batch row, realtime row), b'' = none."""

    generation: Generation
    rows: dict[str, tuple[bytes, bytes]]


class SessionReads:
    """Atomic reads of a session view's parts through ``store`` (its checks: generation, view, versions)."""

    def __init__(self, store: ServingStore, max_keys: int) -> None:
        self.store, self.max_keys = store, max_keys
        self._key = store.client.register_script(_KEY)
        self._all = store.client.register_script(_ALL)

    async def key(self, view: str, key: str) -> SessionRows:
        """``key``'s batch and realtime parts of ``view``, in one call."""
        bucket = self.store.keys.for_key(key)
        generation, processed, meta, batch, realtime = await self.store.call(self._key, bucket, [bucket.prefix, view, key])
        rows = {key: (batch, realtime)} if batch or realtime else {}
        return SessionRows(self.store.served(view, generation, processed, meta), rows)

    async def every_key(self, view: str) -> SessionRows:
        """Every key's parts of ``view``, all buckets at one generation and version. TooManyKeysError past
        ``max_keys`` rows in a bucket."""
        buckets = list(self.store.keys.all_buckets())
        replies = await self.store.consistent(view, lambda: asyncio.gather(*(self._bucket(b, view) for b in buckets)))
        rows: dict[str, tuple[bytes, bytes]] = {}
        for reply in replies:
            if reply[3] == b"too many":
                raise TooManyKeysError(
                    f"view {view!r} holds {int(reply[4]):,} rows in one part of the store, more than a session top-N "
                    f"reads ({self.max_keys:,}, LAMBDA_MAX_SESSION_TOP_KEYS): ask for a key's sessions instead")
            _collect(rows, reply[3], 0)
            _collect(rows, reply[4], 1)
        return SessionRows(self.store.served(view, *replies[0][:3]), rows)

    async def _bucket(self, bucket: Keys, view: str) -> list:
        return await self.store.call(self._all, bucket, [bucket.prefix, view, self.max_keys])


def _collect(rows: dict[str, tuple[bytes, bytes]], flat: list, side: int) -> None:
    """Add a flat (key, row...) reply as the ``side`` (0 batch, 1 realtime) of each key's rows."""
    for t in range(0, len(flat), 2):
        key, row = flat[t].decode(), flat[t + 1]
        have = rows.get(key, (b"", b""))
        rows[key] = (row, have[1]) if side == 0 else (have[0], row)
