"""The batch-run registry's Lua scripts (``serving.store.runs``): every state change is one of them.

Key names come from ``LUA_RUN_NAMES`` (the Lua twins of ``Keys``' registry keys).
"""

from __future__ import annotations

from serving.store.batch_run import INTERRUPTED
from serving.store.keys import LUA_RUN_NAMES

# Every script takes the registry prefix (lp:p:batch) and the caller's clock as ARGV[1], ARGV[2].

_COMMON = LUA_RUN_NAMES + """
local P, now = ARGV[1], ARGV[2]
-- A 'running' run whose lease is not its own was left by a dead scheduler: record it as failed.
local function settle(id)
  local run = run_key(P, id)
  local status = redis.call('HGET', run, 'status')
  if status == 'running' and redis.call('GET', lease_key(P)) ~= id then
    local last = redis.call('HGET', run, 'heartbeat_at') or redis.call('HGET', run, 'started_at') or now
    local started = tonumber(redis.call('HGET', run, 'started_at') or last)
    redis.call('HSET', run, 'status', 'failed', 'finished_at', last, 'duration_seconds', tonumber(last) - started,
               'error', '%(interrupted)s')
    return 'failed'
  end
  return status
end
-- The active run (queued or running), or false.
local function active()
  local id = redis.call('GET', active_key(P))
  if not id then return false end
  local status = settle(id)
  if status == 'queued' or status == 'running' then return id end
  redis.call('DEL', active_key(P))
  return false
end
local function trim(keep)
  local n = redis.call('ZCARD', runs_key(P))
  if n <= keep then return end
  local current = redis.call('GET', active_key(P))
  for _, id in ipairs(redis.call('ZRANGE', runs_key(P), 0, n - keep - 1)) do
    if id ~= current then
      redis.call('ZREM', runs_key(P), id)
      redis.call('DEL', run_key(P, id))
    end
  end
end
local function create(id, status, trigger, force, keep)
  redis.call('HSET', run_key(P, id), 'id', id, 'status', status, 'trigger', trigger, 'force', force, 'requested_at', now)
  redis.call('ZADD', runs_key(P), now, id)
  redis.call('SET', active_key(P), id)
  trim(keep)
end
""".replace("%(interrupted)s", INTERRUPTED + ": the scheduler running it stopped (its lease expired) before it "
                                          "recorded an outcome; the served generation shows what is served")

# ARGV: P, now, id, trigger, force, keep -> {1, record} admitted, or {0, the active run's record}
# (flat HGETALLs read in the same step as the decision, so a conflict names the state that caused it)
ENQUEUE = _COMMON + """
local current = active()
if current then return {0, redis.call('HGETALL', run_key(P, current))} end
local id = ARGV[3]
create(id, 'queued', ARGV[4], ARGV[5], tonumber(ARGV[6]))
redis.call('RPUSH', queue_key(P), id)
return {1, redis.call('HGETALL', run_key(P, id))}
"""

# ARGV: P, now, owner, lease ms, mode ('queued' | 'new'), new id, trigger, force, keep
# -> {1, id} claimed (running, lease held), {0, id or false} busy / nothing queued
CLAIM = _COMMON + """
local owner, lease_ms, mode = ARGV[3], ARGV[4], ARGV[5]
local holder = redis.call('GET', lease_key(P))
if holder then return {0, holder} end
local current = active()
local id
if mode == 'queued' then
  while true do
    id = redis.call('LPOP', queue_key(P))
    if not id then return {0, current} end
    if redis.call('HGET', run_key(P, id), 'status') == 'queued' then break end
  end
else
  if current then return {0, current} end
  id = ARGV[6]
  create(id, 'queued', ARGV[7], ARGV[8], tonumber(ARGV[9]))
end
redis.call('SET', active_key(P), id)
redis.call('SET', lease_key(P), id, 'PX', lease_ms)
redis.call('HSET', run_key(P, id), 'status', 'running', 'started_at', now, 'heartbeat_at', now, 'owner', owner)
return {1, id}
"""

# ARGV: P, now, id, lease ms -> 1 renewed, 0 lease lost
RENEW = _COMMON + """
local id = ARGV[3]
if redis.call('GET', lease_key(P)) ~= id then return 0 end
redis.call('PEXPIRE', lease_key(P), ARGV[4])
redis.call('HSET', run_key(P, id), 'heartbeat_at', now)
return 1
"""

# ARGV: P, now, id, field, value, ... -> 1
UPDATE = _COMMON + """
local id = ARGV[3]
if #ARGV > 3 and redis.call('EXISTS', run_key(P, id)) == 1 then redis.call('HSET', run_key(P, id), unpack(ARGV, 4)) end
return 1
"""

# ARGV: P, now, id, field, value, ... (the outcome) -> 1
FINISH = _COMMON + """
local id = ARGV[3]
if redis.call('EXISTS', run_key(P, id)) == 1 then
  redis.call('HSET', run_key(P, id), 'finished_at', now, unpack(ARGV, 4))
  local started = redis.call('HGET', run_key(P, id), 'started_at')
  if started then redis.call('HSET', run_key(P, id), 'duration_seconds', tonumber(now) - tonumber(started)) end
end
if redis.call('GET', lease_key(P)) == id then redis.call('DEL', lease_key(P)) end
if redis.call('GET', active_key(P)) == id then redis.call('DEL', active_key(P)) end
return 1
"""

# ARGV: P, now, id... -> one flat HGETALL per id (settled first; {} when unknown)
READ = _COMMON + """
local out = {}
for i = 3, #ARGV do
  settle(ARGV[i])
  out[#out + 1] = redis.call('HGETALL', run_key(P, ARGV[i]))
end
return out
"""

# ARGV: P, now, offset, limit -> {active id or '', {flat HGETALL}...} newest first
LIST = _COMMON + """
local current = active() or ''
local out = {current}
local limit = tonumber(ARGV[4])
if limit < 1 then return out end
for _, id in ipairs(redis.call('ZREVRANGE', runs_key(P), tonumber(ARGV[3]), tonumber(ARGV[3]) + limit - 1)) do
  settle(id)
  out[#out + 1] = redis.call('HGETALL', run_key(P, id))
end
return out
"""
