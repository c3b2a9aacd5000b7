"""The threshold merge (Fagin's threshold algorithm) in Lua: an exact top-N over several ranked lists.

Its read scripts are ``TOP`` (one window: its batch ranking and realtime set) and ``RANGE_TOP`` (several
panes: two lists each) in ``serving.store.read_scripts``; this module holds what they share and why it is exact.

A top-N reads a measure's parts from ranked lists, one sorted set per part: a window's batch ranking
(built on first use, ``serving.store.rankings``) and its realtime segment's sorted set (kept by the
speed layer); a range of panes has two lists per pane. A key's merged value is the monoid combine of
its parts in every list, in list order (pane by pane, batch then realtime): the order
``serving.api.queries`` folds them in with ``Measure.combine``, so the numbers here and there are the
same doubles.

**The merge.** Read every list from its top in pages, all lists alike; score every key met exactly (a
``ZSCORE`` of each list it was not met in); stop once ``n`` keys score strictly above ``bound``, what
any key not yet met can reach. The keys met then hold the exact top ``n``: every other key scores at
most ``bound``, below those ``n``.

**Why ``bound`` holds** (``last[l]``: the score of the last entry read from list ``l``; ``NONE`` when
list ``l`` has been read to its end). A key ``k`` not met has, in each list not read to its end,
no part or a part ``<= last[l]`` (the list is sorted and ``k`` is not in the part read), and no part
in a list read to its end.

* ``max``: ``k``'s value is its largest part, ``<= max(last)``.
* ``min``: its value is its smallest part, ``<=`` any of its parts, ``<= max(last)``.
* ``sum``: its value is the sum of its parts in list order; a missing part adds nothing. If some
  ``last[l] > 0``, each term is ``<= max(last[l], 0)`` (and ``0`` for lists read to the end), and
  IEEE addition rounds monotonically (``a <= a'`` and ``b <= b'`` give ``fl(a + b) <= fl(a' + b')``),
  so ``fl``-summing those bounds in the same order bounds ``k``'s computed value: exactness does not
  depend on rounding. If every ``last[l] <= 0``, every part of ``k`` is ``<= 0``, and adding a
  non-positive number never rounds up, so ``k``'s value is at most its first part ``<= max(last)``.

Keys of a micro-batch not yet committed sit in a realtime set at their new score: they are all met
first, at their saved (committed) score, so the sorted order bounds only keys at their committed
score. An overflowed sum (a part of ``+inf``, ``shared_logic.measures``) has no number to rank by: it
is met like any key but never counted among the ``n`` nor returned.

**Skipping keys that cannot make it.** A key met in a page has a *ceiling*, at least its value: its
parts read so far, and for each list not read down to it what ``bound`` allows there (``max(last[l], 0)``
for a sum, ``last[l]`` for a max; a min is at most its smallest part read). The keys met in a round are
scored highest ceiling first, and once ``n`` keys are scored the rest whose ceiling is strictly below the
``n``-th value scored are not: their value is below ``n`` others, whatever it is (the same monotone
rounding argument holds for the ceiling's sum). A key skipped so is met again if a later page holds it,
with more of its parts read; the stop rule above counts only keys scored.

**Skipping, over many panes.** ``RANGE_TOP`` (``serving.store.range_top``) bounds a ceiling more cheaply,
by the key's parts read alone: for a sum, every open list's ``max(last, 0)`` plus the key's non-negative parts
read, widened by ``1 + 8 (lists + 1) 2**-53`` (real sums of non-negative terms bound both fl-sums within that);
for a max, its largest part read or the largest ``last``; for a min, its smallest part read. It runs in calls
of bounded work, resumed exactly (its module doc says how).

**Cost.** Pages double from ``max(n, 16)`` entries per list; a key met in a page is scored from the
pages already read where it appeared there, by ``ZSCORE`` elsewhere. When the top keys of a range are
near the top of its panes (popular keys are popular in most panes), the merge stops after a page or
two of each list, scoring little more than the top keys themselves; adversarial data (a different top
in every pane) reads deeper, still exactly.
"""

from __future__ import annotations

#: Lua: ``merged(combine, a, b)`` (nil: no part) and ``bound(combine, lasts)`` (``NONE``: a list read to
#: its end), for ``combine`` one of 'sum', 'max', 'min' (``Measure.combines``). See the module docstring.
THRESHOLD = """
local NONE = -math.huge
local function merged(combine, a, b)
  if a == nil then return b elseif b == nil then return a end
  if combine == 'sum' then return a + b elseif combine == 'max' then return math.max(a, b) end
  return math.min(a, b)
end
local function bound(combine, lasts)
  local top, positive, total = NONE, false, 0
  for l = 1, #lasts do
    local v = lasts[l]
    if v > NONE then
      if v > top then top = v end
      if v > 0 then positive = true; total = total + v end
    end
  end
  if combine == 'sum' and positive then return total end
  return top
end
"""
