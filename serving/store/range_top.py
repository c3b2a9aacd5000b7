"""An exact top-N over a range of panes in calls of bounded work: ``RANGE_TOP``, the threshold merge
(``serving.store.threshold``) of every pane's batch ranking and realtime set, resumable.

Redis runs one script at a time and blocks every other client meanwhile, so a merge over many panes whose
keys differ (each key met costs a ``ZSCORE`` in every other list) cannot be one call: over 288 such panes
one call ran 23 s. Each call here does at most ``budget`` units of work (an entry read from a ranked list,
or a ``ZSCORE``) and then answers 'more' with its state: where its round of reads began in each list, the
keys met and the ``n`` best values scored. The next call goes on from there.

**Exact across calls.** Every call of one answer must name the same generation and realtime ``processed``
version (else it starts over): then the batch rankings are the same sets and every realtime part read is
the one committed at ``processed``. A value scored stays the value at that version, so the ``n`` best carry
over; a key skipped because its ceiling was below the ``n``-th best is below it for good (the ``n``-th best
only grows), so it is never met again. A batch ranking never changes within a generation, so a round goes
on at its offset. A realtime set changes between calls only where a micro-batch in flight moves a key (it
is then in the undo log, and every call scores those keys first at their saved score): a realtime list goes
on right after the last key it read that no micro-batch had moved, found again by ``ZREVRANK``, and if a
micro-batch has since moved that key too, the answer starts over. A call paused within a round reads that
round's pages again (their cost is at most half the budget: pages shrink with the lists still open) and
skips the keys already met.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable

from serving.store.errors import StoreUnavailableError
from serving.store.keys import WINDOW_SEPARATOR
from serving.store.read_scripts import HEADER
from serving.store.reads import RangeTopAsk
from serving.store.threshold import THRESHOLD

#: Work one ``RANGE_TOP`` call does at most by default: an entry read from a list (and looked up among the keys
#: met), or a list a key is scored in. A unit cost about 10 us of Lua on this 2-core machine under load (a
#: ``ZSCORE`` from Lua, the dearest): a call of 20,000 keeps Redis busy some 0.2 s at most, far below the API's
#: 2 s socket timeout.
DEFAULT_TOP_BUDGET = 20_000

#: Least budget per pane of a range: a call must find where each realtime list goes on (2 a pane), read a page
#: of every list (its entries, at most a sixth of the budget, each looked up and perhaps skipped: half) and
#: score a key in every list (2 a pane, + 1).
BUDGET_PER_PANE = 16

#: How often one bucket's answer starts over (a flip, a micro-batch commit, rankings built) before it refuses.
_STARTS = 8

#: One call of ``RANGE_TOP`` on the bucket (its arguments) and the build of a pane's batch ranking
#: (generation, pane start, the view's row layout).
Call = Callable[[list], Awaitable[list]]
Build = Callable[[int, int, bytes], Awaitable[None]]

# ARGV: prefix, view, measure, n, combine ('sum', 'max' or 'min'), generation just ranked ('' = none),
# panes, then per pane: its suffix and '1' when its batch ranking was just built for that generation; then the work
# budget (entries read + ZSCOREs, ``serving.store.range_tops``) and the state a 'more' reply gave ('' = start).
# Answers {generation, processed, meta, keys scored in this call (key, value, then its part in each list, '' = none),
# status, state, floor}: status 'done' (floor: the n-th best value scored, '' = none: the candidates are every key
# scored at or above it, ties included), 'more' (the budget is spent: call again with the state) or 'restart' (a
# realtime list's cursor key moved: start over). Every pane whose rows exist without a ranking, at once:
# {generation, 'unranked', layout, suffix...}: each is built on first use, as for TOP.
RANGE_TOP = HEADER + THRESHOLD + """
local measure, n, combine, ranked, np = ARGV[3], tonumber(ARGV[4]), ARGV[5], ARGV[6], tonumber(ARGV[7])
local budget, st = tonumber(ARGV[8 + 2 * np]), ARGV[9 + 2 * np]
local lists, saved, unranked = {}, {}, {}
for j = 1, np do
  local sfx, built = ARGV[6 + 2 * j], ARGV[7 + 2 * j]
  local bz = scores_key(bp, measure, sfx)
  if not (generation == ranked and built == '1') and redis.call('EXISTS', bz) == 0
      and redis.call('EXISTS', rows_key(bp, sfx)) == 1 then
    unranked[#unranked + 1] = sfx
  end
  lists[2 * j - 1], lists[2 * j] = bz, scores_key(sp, measure, sfx)
  local inflight = {}
  if #unranked == 0 and uncommitted(sp, sfx) then
    local undo, at = redis.call('HGETALL', undo_key(sp, sfx)), position_of(measure)
    for t = 1, #undo, 2 do inflight[undo[t]] = undo[t + 1] ~= '' and cjson.decode(undo[t + 1])[at] or '' end
  end
  saved[2 * j - 1], saved[2 * j] = {}, inflight
end
if #unranked > 0 then return {generation, 'unranked', meta[5] or '[]', unpack(unranked)} end
local nl = #lists
-- The state between calls: the round's start (batch offset at, each realtime list's last key read that no
-- micro-batch in flight had moved, lists read to their end), its nominal page, how many keys were met (scored,
-- or skipped for good: they are the set ``met``, a scratch key of this answer) and the n best values scored.
st = st ~= '' and cjson.decode(st) or {at = 0, next = math.max(n, 16), met = 0, best = {}, from = {}, closed = {}}
local sk = top_seen_key(ARGV[1], ARGV[10 + 2 * np])
local work, out, seen, marked, best, known = 0, {}, {}, {}, {}, {}
for t, v in ipairs(st.best) do best[t] = v == '-inf' and -math.huge or tonumber(v) end
local function num(x) return x == -math.huge and '-inf' or string.format('%.17g', x) end
local progress = false  -- a key met or a round done in this call: a 'more' without either is 'stuck'
local function reply(status)
  if st.met > 0 then
    redis.replicate_commands(); redis.set_repl(redis.REPL_NONE)  -- a reader's scratch: neither persisted nor replicated
    if status ~= 'more' then redis.call('DEL', sk)
    else
      for t = 1, #marked, 1000 do redis.call('SADD', sk, unpack(marked, t, math.min(t + 999, #marked))) end
      redis.call('PEXPIRE', sk, 60000)
    end
  end
  if status == 'more' and not progress then status = 'stuck' end
  if status == 'done' then return {generation, processed, meta, out, status, '', #best > 0 and num(best[#best]) or ''} end
  st.best = {}
  for t, v in ipairs(best) do st.best[t] = num(v) end
  return {generation, processed, meta, out, status, cjson.encode(st), ''}
end
if st.met > 0 and redis.call('EXISTS', sk) == 0 then return reply('restart') end  -- the scratch is gone
local function met(key)  -- met before, in this call or an earlier one
  local v = seen[key]
  if v == nil then
    v = st.met > #marked and redis.call('SISMEMBER', sk, key) == 1; work = work + 1; seen[key] = v
  end
  return v
end
local function mark(key)
  seen[key] = true; marked[#marked + 1] = key; st.met = st.met + 1; work = work + 1; progress = true
end
local function keep(m)  -- best: the n highest values scored, highest first
  local at = #best + 1
  while at > 1 and best[at - 1] < m do at = at - 1 end
  if at <= n then table.insert(best, at, m); best[n + 1] = nil end
end
local function score(key)  -- its part in every list: nl units of work, whether read already or looked up
  mark(key)
  work = work + nl
  local m, row = nil, {}
  for l = 1, nl do
    local s = saved[l][key]
    if s == nil then s = known[l] and known[l][key] end
    if s == nil then s = redis.call('ZSCORE', lists[l], key) or '' end
    row[l] = s
    if s ~= '' then m = merged(combine, m, tonumber(s)) end
  end
  if m ~= nil and m < math.huge then
    keep(m); out[#out + 1] = key; out[#out + 1] = num(m)
    for l = 1, nl do out[#out + 1] = row[l] end
  end
end
for l = 2, nl, 2 do
  for key in pairs(saved[l]) do
    if not met(key) then
      if work + nl + 1 > budget then return reply('more') end
      score(key)
    end
  end
end
-- Where the round starts in each list: a batch ranking never changes; a realtime set changes only where a
-- micro-batch in flight moves keys (all scored above), so a list goes on after its last key read that none moved.
local pos, open = {}, 0
for l = 1, nl do
  local c = st.from[tostring(l)]
  if st.closed[tostring(l)] then pos[l] = nil
  elseif l % 2 == 1 or c == nil then pos[l] = l % 2 == 1 and st.at or 0; open = open + 1
  else
    work = work + 2
    local r = redis.call('ZREVRANK', lists[l], c[1])
    if r == nil or saved[l][c[1]] ~= nil or redis.call('ZSCORE', lists[l], c[1]) ~= c[2] then return reply('restart') end
    pos[l] = r + 1; open = open + 1
  end
end
-- A ceiling is at least a key's value, from its parts read in the round and what the lists allow: for a sum,
-- every list's bound max(last, 0) plus its non-negative parts read, widened by the sum's rounding (each term
-- of the key's fl-sum is at most its term here: serving.store.threshold); for a max, its largest part read
-- or the largest last; for a min, its smallest part read. Each costs the key's entries, not the lists.
local slack = 1 + 8 * (nl + 1) * 2 ^ -53
while true do
  local page = math.max(1, math.min(st.next, 4096, math.floor(budget / 6 / math.max(open, 1))))
  if work + 3 * open * page > budget then return reply('more') end  -- entries read, looked up, maybe skipped
  local order, last, from, acc = {}, {}, {}, {}
  local lists_bound, top_last = 0, NONE
  for l = 1, nl do
    known[l] = {}
    if pos[l] == nil then last[l] = NONE
    else
      local rs = redis.call('ZREVRANGE', lists[l], pos[l], pos[l] + page - 1, 'WITHSCORES')
      work = work + #rs / 2
      for t = 1, #rs, 2 do
        local key, v = rs[t], tonumber(rs[t + 1])
        known[l][key] = rs[t + 1]
        if not met(key) then
          local a = acc[key]
          if a == nil then order[#order + 1] = key; acc[key] = combine == 'sum' and math.max(v, 0) or v
          elseif combine == 'sum' then acc[key] = a + math.max(v, 0)
          else acc[key] = merged(combine, a, v) end
        end
      end
      last[l] = #rs < 2 * page and NONE or tonumber(rs[#rs])
      for t = #rs - 1, 1, -2 do
        if l % 2 == 0 and saved[l][rs[t]] == nil then from[tostring(l)] = {rs[t], rs[t + 1]}; break end
      end
    end
    if last[l] > NONE then lists_bound = lists_bound + math.max(last[l], 0); top_last = math.max(top_last, last[l]) end
  end
  local ceilings = {}
  for _, key in ipairs(order) do
    if combine == 'sum' then ceilings[key] = (lists_bound + acc[key]) * slack
    elseif combine == 'max' then ceilings[key] = math.max(acc[key], top_last)
    else ceilings[key] = acc[key] end
  end
  table.sort(order, function(a, b) return ceilings[a] > ceilings[b] end)
  for _, key in ipairs(order) do  -- highest ceiling first: once n values beat a key's ceiling, it is out for good
    if #best >= n and ceilings[key] < best[n] then mark(key)
    elseif work + nl + 1 > budget then return reply('more')
    else score(key) end
  end
  local still = false
  for l = 1, nl do
    if pos[l] ~= nil then
      if last[l] == NONE then st.closed[tostring(l)] = true; pos[l] = nil; open = open - 1
      else pos[l] = pos[l] + page; still = true end
    end
  end
  for l, c in pairs(from) do st.from[l] = c end
  st.at, st.next, progress = st.at + page, math.min(st.next * 2, 4096), true
  if not still or (#best >= n and best[n] > bound(combine, last)) then return reply('done') end
end
"""


async def bucket_range_top(call: Call, build: Build, ask: RangeTopAsk, args: Callable[..., list], budget: int) -> list:
    """One bucket's answer {generation, processed, meta, candidates (``RangeTopAsk.candidates``)}, in calls of at most
    ``budget`` work each; ``args(ranked, built, budget, state, token)``: a call's arguments (``token``: names
    the answer's scratch set of keys met). Each pane's batch ranking
    is built on first use (every unranked pane of a reply at once)."""
    if budget < BUDGET_PER_PANE * len(ask.window_starts):
        raise ValueError(f"a budget of {budget} cannot merge {len(ask.window_starts)} panes: at least {BUDGET_PER_PANE} "
                         "a pane")
    ranked, built = "", frozenset[int]()
    for _ in range(_STARTS):
        state: bytes | str = ""
        token = uuid.uuid4().hex
        found: list[list] = []
        at = None
        while True:
            reply = await call(args(ranked, built, budget, state, token))
            if len(reply) >= 4 and reply[1] == b"unranked":
                if reply[0].decode() != ranked:  # a new generation (a flip): its rankings are another set
                    ranked, built = reply[0].decode(), frozenset()
                starts = [int(sfx.decode().removeprefix(WINDOW_SEPARATOR)) for sfx in reply[3:]]
                for start in starts:
                    await build(int(ranked), start, reply[2])
                built = built | set(starts)
                break
            generation, processed, meta, scored, status, state, floor = reply
            if status == b"restart" or at not in (None, (generation, processed)):
                break
            if status == b"stuck":
                raise StoreUnavailableError(
                    f"the top-N of {ask.view!r} over {len(ask.window_starts)} panes cannot go on within one call's work "
                    f"budget ({budget}: a micro-batch in flight over many keys of the range?); raise "
                    "LAMBDA_TOP_CALL_BUDGET or ask a shorter range (from/to, last)", retry_after=1)
            at = (generation, processed)
            found.append(scored)
            if status == b"done":
                return [generation, processed, meta, _at_least(found, floor, 2 + 2 * len(ask.window_starts))]
    raise StoreUnavailableError(
        f"the top-N of {ask.view!r} over {len(ask.window_starts)} panes kept starting over (batch runs, micro-batch "
        "commits or rankings built in between): ask again", retry_after=1)


def _at_least(found: list[list], floor: bytes, width: int) -> list:
    """The keys scored (key, value, parts...) whose value is at least ``floor``, as key, parts... (no value)."""
    if not floor:
        return []
    least, out = float(floor), []
    for flat in found:
        for i in range(0, len(flat), width):
            if float(flat[i + 1]) >= least:
                out += [flat[i], *flat[i + 2:i + width]]
    return out
