"""The Lua side of the serving store's reads (``serving.store.reader``): each read is one atomic call.

Key names come from ``serving.store.keys`` (``LUA_NAMES``). A read resolves the generation pointer
first and reads only that generation and its realtime segment, as of the segment's committed
``processed`` version.
"""

from __future__ import annotations

from serving.store.generation_meta import LUA_META
from serving.store.keys import LUA_NAMES
from serving.store.threshold import THRESHOLD

# Every read states the version it is exact at: the generation, or the realtime segment's
# ``processed``. A realtime row is a hash field in the batch row's layout (``speed_layer.segments``):
# scores as strings ('' = none), per distinct measure its exact values or null (a HyperLogLog).
# Rows a micro-batch not yet committed (undo tag above ``processed``) has changed read as saved
# before it: ``realtime_row(vp, sfx, key)`` is a row's committed parts (or nil) and whether they are
# the saved ones, ``realtime_sketch(vp, measure, field, saved)`` a committed sketch's key.
HEADER = LUA_NAMES + LUA_META + """
local generation = redis.call('GET', KEYS[1])
if not generation then return false end
local p, view = ARGV[1], ARGV[2]
local bp = generation_view(p, generation, view)
local processed = redis.call('HGET', segment_meta(p, generation), 'processed') or ''
local committed = tonumber(processed) or -1
-- A segment with no processed version has nothing committed (its first micro-batch is in flight, or the
-- speed layer is dropping it, meta first: serving.store.segments.Segments.reset): none of it is read, so the
-- answer is the generation's alone, as processed = '' says. ('none' is no base: no key has this prefix.)
local sp = processed ~= '' and segment_view(p, generation, view) or segment_view(p, 'none', view)
local meta = redis.call('HMGET', generation_meta(p, generation), meta_header(view))
local positions = nil  -- row part name -> index in a batch or realtime row and an undo entry (the view's layout)
local function position_of(name)
  if not positions then
    positions = {}
    for pos, part in ipairs(cjson.decode(meta[5] or '[]')) do positions[part] = pos end
  end
  return positions[name]
end
local function uncommitted(vp, sfx)
  return tonumber(redis.call('GET', undo_tag_key(vp, sfx)) or '-1') > committed
end
local function realtime_row(vp, sfx, key)
  if uncommitted(vp, sfx) then
    local entry = redis.call('HGET', undo_key(vp, sfx), key)
    if entry then return entry ~= '' and cjson.decode(entry) or nil, true end
  end
  local row = redis.call('HGET', rows_key(vp, sfx), key)
  return row and cjson.decode(row) or nil, false
end
local function realtime_sketch(vp, measure, field, saved)
  return saved and previous_key(vp, measure, field) or sketch_key(vp, measure, field)
end
"""

# ARGV: prefix, view, n measures, measures..., n distinct, distinct..., n items, (key, suffix)...
# A row's batch part and its realtime part are one hash field each (JSON arrays, parts in the
# generation's row layout, ``generation_meta.measures_field``). A distinct measure's values are an exact list in either
# or, for larger rows, a HyperLogLog. Exact lists alone are counted exactly (their union); to merge
# with HyperLogLogs they are folded into a scratch sketch that is neither persisted nor replicated.
READ = HEADER + """
local i = 3
local nm = tonumber(ARGV[i]); local measures = {}
for j = 1, nm do measures[j] = ARGV[i + j] end
i = i + nm + 1
local nd = tonumber(ARGV[i]); local distinct = {}
for j = 1, nd do distinct[j] = ARGV[i + j] end
i = i + nd + 1
local ni = tonumber(ARGV[i])
local layout = meta[5] or '[]'  -- the HEADER's row layout of the view
local scratch, quiet = scratch_key(p), false
local function fold(members, sketches)
  if not quiet then redis.replicate_commands(); redis.set_repl(redis.REPL_NONE); quiet = true end
  redis.call('DEL', scratch)
  for t = 1, #members, 1000 do redis.call('PFADD', scratch, unpack(members, t, math.min(t + 999, #members))) end
  local n = redis.call('PFCOUNT', scratch, unpack(sketches))
  redis.call('DEL', scratch)
  return n
end
local function union(a, b)  -- the distinct values of two exact lists
  local seen, n = {}, 0
  for _, list in ipairs({a, b}) do
    for _, m in ipairs(list) do if not seen[m] then seen[m] = true; n = n + 1 end end
  end
  return n
end
local rows, realtimes, dbatch, drealtime, dmerged = {}, {}, {}, {}, {}
local uexact, usketch = {}, {}
for j = 1, nd do uexact[j] = {}; usketch[j] = {} end
for k = 1, ni do
  local key, sfx = ARGV[i + 2 * k - 1], ARGV[i + 2 * k]
  local row = redis.call('HGET', rows_key(bp, sfx), key)
  local r, db, dr, dm = {}, {}, {}, {}
  local live, saved = realtime_row(sp, sfx, key)
  live = live or {}
  for j = 1, nm do r[j] = live[position_of(measures[j]) or 0] or '' end
  local parts = (nd > 0 and row) and cjson.decode(row) or {}
  for j = 1, nd do
    -- The realtime part: an exact list (rexact) or a sketch (rk), or neither.
    local have, rexact, rk = live[position_of(distinct[j]) or 0], nil, nil
    if type(have) == 'table' then rexact = have
    elseif have == cjson.null then rk = realtime_sketch(sp, distinct[j], key .. sfx, saved) end
    dr[j] = rexact and #rexact or (rk and redis.call('PFCOUNT', rk) or 0)
    if rk then table.insert(usketch[j], rk) end
    for _, m in ipairs(rexact or {}) do uexact[j][m] = true end
    local exact = parts[position_of(distinct[j]) or 0]
    if type(exact) == 'table' then
      db[j] = #exact
      if rexact then dm[j] = union(exact, rexact) elseif rk then dm[j] = fold(exact, {rk}) else dm[j] = #exact end
      for _, m in ipairs(exact) do uexact[j][m] = true end
    else
      local bk = sketch_key(bp, distinct[j], key .. sfx)
      db[j] = redis.call('PFCOUNT', bk)
      if db[j] == 0 then dm[j] = dr[j]
      elseif rexact then dm[j] = fold(rexact, {bk})
      elseif rk then dm[j] = redis.call('PFCOUNT', bk, rk)
      else dm[j] = db[j] end
      if db[j] > 0 then table.insert(usketch[j], bk) end
    end
  end
  rows[k], realtimes[k], dbatch[k], drealtime[k], dmerged[k] = row or '', r, db, dr, dm
end
local total = {}
for j = 1, nd do
  if ni == 1 then total[j] = dmerged[1][j]
  else
    local members = {}
    for m in pairs(uexact[j]) do members[#members + 1] = m end
    if #usketch[j] == 0 then total[j] = #members else total[j] = fold(members, usketch[j]) end
  end
end
return {generation, processed, meta, layout, rows, realtimes, dbatch, drealtime, dmerged, total}
"""

# ARGV: prefix, view, measure, suffix, n, generation just ranked (or ''), how the measure combines
# ('sum', 'max', 'min', or '' when unknown), the realtime rows up to which every one is read (a
# threshold merge of a small segment reads as much, in more calls). Candidates for an exact top n, answered as
# {generation, processed, meta, batch-only candidates (key, score...), candidates with a realtime
# part (key, score...), their batch scores ('' = none)}:
# * combine known: a threshold merge (Fagin's TA, ``serving.store.threshold``) of the batch ranking and the
#   realtime sorted set,
#   read in descending pages: every key read is scored exactly (both parts); it stops once n of
#   them score strictly above what any key not yet read can reach (``bound``: a key not read has
#   batch <= the last batch score read and realtime <= the last realtime score read, or lacks that
#   part), so its cost follows n, not the realtime segment's size. Keys of a micro-batch not yet
#   committed sit in the sorted set at their new score: they are all read, at their saved one.
# * combine unknown, or a small segment: every key of the realtime segment (R of them) and the batch's top n + R
#   (+ ties): only realtime keys can change.
# An overflowed sum's part is scored +inf (``shared_logic.measures.OVERFLOW_PART``) and its merged value is not a
# number: such keys are read (the caller leaves them out of the ranking) but never counted among the n, and the
# batch's top n + R above is of finite scores.
# The batch ranking is built on first use (``ServingStore._rank``); until then the answer is
# {generation, 'unranked', layout}; a ranking just built may be absent only because it is empty.
TOP = HEADER + THRESHOLD + """
local measure, sfx, n, combine = ARGV[3], ARGV[4], tonumber(ARGV[5]), ARGV[7]
local bz, rz = scores_key(bp, measure, sfx), scores_key(sp, measure, sfx)
if generation ~= ARGV[6] and redis.call('EXISTS', bz) == 0 and redis.call('EXISTS', rows_key(bp, sfx)) == 1 then
  return {generation, 'unranked', meta[5] or '[]'}
end
local saved = {}
if uncommitted(sp, sfx) then
  local undo, at = redis.call('HGETALL', undo_key(sp, sfx)), position_of(measure)
  for t = 1, #undo, 2 do saved[undo[t]] = undo[t + 1] ~= '' and cjson.decode(undo[t + 1])[at] or '' end
end
local top, realtime, under = {}, {}, {}
if combine == '' or redis.call('ZCARD', rz) <= tonumber(ARGV[8]) then
  local all = redis.call('ZRANGE', rz, 0, -1, 'WITHSCORES')
  for t = 1, #all, 2 do
    local score = saved[all[t]] or all[t + 1]
    if score ~= '' then realtime[#realtime + 1] = all[t]; realtime[#realtime + 1] = score end
  end
  local want = n + #realtime / 2
  top = want > 0 and redis.call('ZREVRANGEBYSCORE', bz, '(+inf', '-inf', 'WITHSCORES', 'LIMIT', 0, want) or {}
  if #top / 2 == want and want > 0 then
    local last = top[#top]
    local ties = redis.call('ZRANGEBYSCORE', bz, last, last, 'WITHSCORES')
    for t = 1, #ties do top[#top + 1] = ties[t] end
  end
  for t = 1, #realtime, 2 do under[#under + 1] = redis.call('ZSCORE', bz, realtime[t]) or '' end
  return {generation, processed, meta, top, realtime, under}
end
local seen, above = {}, {}
local function see(key)
  if seen[key] then return end
  seen[key] = true
  local b = redis.call('ZSCORE', bz, key)
  local r = saved[key] or redis.call('ZSCORE', rz, key) or ''
  if r ~= '' then
    realtime[#realtime + 1] = key; realtime[#realtime + 1] = r; under[#under + 1] = b or ''
  elseif b then
    top[#top + 1] = key; top[#top + 1] = b
  else
    return
  end
  local m = merged(combine, b and tonumber(b) or nil, r ~= '' and tonumber(r) or nil)
  if m < math.huge then above[#above + 1] = m end  -- an overflowed value is no candidate for the n
end
for key in pairs(saved) do see(key) end
local lb, lr, at, page = 0, 0, 0, math.max(n, 16)
while true do
  local bs = redis.call('ZREVRANGE', bz, at, at + page - 1, 'WITHSCORES')
  local rs = redis.call('ZREVRANGE', rz, at, at + page - 1, 'WITHSCORES')
  for t = 1, #bs, 2 do see(bs[t]) end
  for t = 1, #rs, 2 do see(rs[t]) end
  lb = #bs < 2 * page and NONE or tonumber(bs[#bs])
  lr = #rs < 2 * page and NONE or tonumber(rs[#rs])
  if lb == NONE and lr == NONE then break end
  local reach, count = bound(combine, {lb, lr}), 0
  for _, m in ipairs(above) do if m > reach then count = count + 1 end end
  if count >= n then break end
  at, page = at + page, math.min(page * 2, 4096)
end
return {generation, processed, meta, top, realtime, under}
"""

# KEYS: the ranking's temporary key, the ranking, the generation pointer; ARGV: the generation.
# Installs it unless another request already did, or the generation is no longer served (a drop
# may have run mid-build: installing then would leave a ranking no drop will find).
INSTALL_RANKING = """
if redis.call('GET', KEYS[3]) ~= ARGV[1] or redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('DEL', KEYS[1])
  return 0
end
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('RENAME', KEYS[1], KEYS[2])
return 1
"""

# ARGV: prefix, view, key prefix, lo lex bound, hi lex bound, keys a pane, n panes, (suffix)...
# Candidates for a page of keys in key order, every pane's rows combined per key: per pane, the first
# batch keys in [lo, hi] from the generation's key index (ZRANGEBYLEX: bytewise; at most ``each``) and
# every realtime key of the segment with the key prefix (the caller drops those at or before its cursor:
# Lua's string order follows Redis's locale, so this script compares no strings). Each pane answers
# {batch, realtime}, in the order asked; a pane that gave ``each`` batch keys may hold more after its last.
# A pane whose rows exist but whose index does not yet answers {generation, 'unindexed', suffix}:
# the index is built on first use (``ServingStore._index``), like the rankings.
LIST = HEADER + """
local kp, lo, hi, each, ns = ARGV[3], ARGV[4], ARGV[5], tonumber(ARGV[6]), tonumber(ARGV[7])
local panes = {}
for w = 1, ns do
  local sfx = ARGV[7 + w]
  local ik = index_key(bp, sfx)
  if redis.call('EXISTS', ik) == 0 and redis.call('EXISTS', rows_key(bp, sfx)) == 1 then
    return {generation, 'unindexed', sfx}
  end
  local realtime = {}
  for _, k in ipairs(redis.call('HKEYS', rows_key(sp, sfx))) do
    if kp == '' or string.sub(k, 1, #kp) == kp then realtime[#realtime + 1] = k end
  end
  panes[w] = {redis.call('ZRANGEBYLEX', ik, lo, hi, 'LIMIT', 0, each), realtime}
end
return {generation, processed, meta, panes}
"""
