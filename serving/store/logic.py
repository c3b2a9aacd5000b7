"""Which logic each generation and realtime segment holds: claims that keep two logics apart.

A segment based at ``B`` is *claimed* for one logic fingerprint (``shared_logic.logic``) by its
first writer, with one atomic call on ``lp:p:s:{B}:logic``:

* the speed layer claims it as ``logic/query`` before a micro-batch writes to it, and writes only
  to segments claimed for its own logic *and query* (a restarted query with new code, or after a
  rollback to old code, never adds to what another query counted: its offsets may have skipped
  versions that query wrote);
* the batch run claims it as ``logic`` just before flipping generation ``B`` in, and does not
  flip if the segment holds another logic.

Generation ``B`` records its logic in its meta at the flip; a speed-layer claim is refused once
``B`` is served under another logic. So the generation served and the segment beside it always
hold one logic, and every read, which combines exactly those two, never mixes two logics.

Callers claim, and say or ask what the speed layer waits for, through a pipeline's store session
(``serving.store.session.PipelineStore``); the functions here are its private helpers.
"""

from __future__ import annotations

import redis

from serving.store.generation_meta import LOGIC, LUA_META, VERSION
from serving.store.keys import Keys
from serving.store.replies import text

# KEYS: the segment's claim, the generation's meta, the index of segments (global keys: one slot);
# ARGV: logic, query ('' = the batch), base -> 'ok', or what holds it: 'generation:<logic>' / 'segment:<claim>'.
# A claimed segment is in the index, so it is dropped with the others below the served generation.
_CLAIM = LUA_META + """
local logic, query = ARGV[1], ARGV[2]
redis.call('SADD', KEYS[3], ARGV[3])
if redis.call('HEXISTS', KEYS[2], META_VERSION) == 1 then
  local held = redis.call('HGET', KEYS[2], META_LOGIC) or ''
  if held ~= logic then return 'generation:' .. held end
end
local mine = logic
if query ~= '' then mine = logic .. '/' .. query end
local current = redis.call('GET', KEYS[1])
if not current or current == mine or (query ~= '' and current == logic) then
  redis.call('SET', KEYS[1], mine)
  return 'ok'
end
if query == '' and string.sub(current, 1, #logic + 1) == logic .. '/' then return 'ok' end
return 'segment:' .. current
"""


def claim_segment(client: redis.Redis, keys: Keys, base: int, logic: str, query: str = "") -> str | None:
    """``PipelineStore.claim_segment``: one ``_CLAIM`` call on the global keys."""
    glob = keys.global_keys
    reply = text(client.eval(_CLAIM, 3, glob.segment_logic(base), glob.meta(base), glob.segments, logic, query, base))
    return None if reply == "ok" else reply


def generation_logic(client: redis.Redis, keys: Keys, generation: int) -> str | None:
    """``PipelineStore.generation_logic``: the generation's record, read."""
    meta = keys.global_keys.meta(generation)
    if not client.hexists(meta, VERSION):
        return None
    return text(client.hget(meta, LOGIC) or b"")


#: KEYS: the speed hash; ARGV: logic. Deletes ``waiting_logic`` if it names ``logic``.
_SATISFIED = """
if redis.call('HGET', KEYS[1], 'waiting_logic') == ARGV[1] then redis.call('HDEL', KEYS[1], 'waiting_logic') end
return 1
"""


def mark_waiting(client: redis.Redis, keys: Keys, logic: str | None) -> None:
    """``PipelineStore.mark_waiting``: one HSET or HDEL of the speed hash's ``waiting_logic``."""
    if logic is None:
        client.hdel(keys.global_keys.speed, "waiting_logic")
    else:
        client.hset(keys.global_keys.speed, "waiting_logic", logic)


def waiting_for(client: redis.Redis, keys: Keys) -> str | None:
    """``PipelineStore.waiting_for``: the speed hash's ``waiting_logic``."""
    value = client.hget(keys.global_keys.speed, "waiting_logic")
    return None if value is None else text(value)


def satisfy_waiting(client: redis.Redis, keys: Keys, logic: str) -> None:
    """``PipelineStore.satisfy_waiting``: one ``_SATISFIED`` call (compare and delete)."""
    client.eval(_SATISFIED, 1, keys.global_keys.speed, logic)
