"""A session view's realtime rows are written by their kind (``WriteSpec.sessions``, ``serving.store.segments
.SESSION_ROWS``), not as a measure named like the column: in a real Redis, two micro-batches of session parts
(the second extending and adding sessions) leave each key's row equal to the sessions written out here by hand,
and no sorted set or sketch beside it; the store refuses a session row that carries a score, and a session view
has no measure entry.
"""

from __future__ import annotations

from datetime import timedelta

import pyarrow as pa
import pytest
import redis

from serving.store.keys import Keys
from serving.store.segments import SESSION_ROWS, MicroBatchWrite, WindowWrite, apply_chunk, apply_script
from serving.store.session import PipelineStore
from shared_logic.measures import Count, Sum
from shared_logic.session_parts import decode_part, encode_part, part_of_events
from shared_logic.sessions import MICROS, SessionWindow
from shared_logic.views import View
from speed_layer.realtime_rows import Merged
from speed_layer.segments import DEPTH, KEY, SESSION_PART, WS, WriteSpec, apply_rows, measure_spec, session_spec
from speed_layer.segments import VIEW as VIEW_COL

VIEW = View("visits", keys=("k",), measures=(Count(), Sum("x")), sessions=SessionWindow(timedelta(seconds=10)))
BASE = 10


def _part(*events: tuple[int, int]) -> str:
    """A micro-batch's part of one key: events (seconds, x)."""
    assert VIEW.sessions is not None
    return encode_part(VIEW.measures, part_of_events(VIEW.sessions, VIEW.measures,
                                                     ((t * MICROS, {"x": x}) for t, x in events)))


def _table(parts: dict[str, str]) -> pa.Table:
    keys = sorted(parts)
    return pa.table({VIEW_COL: ["visits"] * len(keys), KEY: keys, WS: pa.array([None] * len(keys), pa.string()),
                     DEPTH: pa.array([1] * len(keys), pa.int32()), SESSION_PART: [parts[k] for k in keys]})


def test_session_rows_are_their_keys_parts_merged_with_no_score_or_sketch(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    keys = Keys("visits")
    epoch = PipelineStore(client, keys).ensure_epoch()
    client.set(keys.current, BASE)
    micro_batches = [{"a": _part((0, 1), (5, 2)), "b": _part((100, 3))},
                     {"a": _part((14, 4), (40, 1)), "b": _part((95, 2))}]  # a: [0, 14] extended, [40] new; b: [95, 100]
    for batch_id, parts in enumerate(micro_batches):
        spec = WriteSpec(redis_url, "visits", "q1", epoch, batch_id, 100 * (batch_id + 1), (BASE,), {}, 10,
                         sessions={"visits": session_spec(VIEW)})
        assert spec.layout("visits") == SESSION_ROWS
        assert apply_rows(spec, _table(parts), "0", client) == 2
    stored = {k: [(s.start // MICROS, s.end // MICROS, dict(s.parts))
                  for s in decode_part(VIEW.measures, client.hget(keys.segment_rows(BASE, "visits"), k)).sessions]
              for k in ("a", "b")}
    assert stored == {"a": [(0, 14, {"count": 3, "sum_x": 7}), (40, 40, {"count": 1, "sum_x": 1})],
                      "b": [(95, 100, {"count": 2, "sum_x": 5})]}
    for name in ("sessions", "count", "sum_x"):
        assert not client.exists(keys.segment_scores(BASE, "visits", name)), name


def test_the_store_refuses_a_session_row_with_a_score_and_a_session_view_has_no_measure_entry(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    keys = Keys("visits")
    batch = MicroBatchWrite("q1", 0, PipelineStore(client, keys).ensure_epoch(), 100, False)
    scored = WindowWrite(BASE, None, ["a"], [None], [Merged(_part((0, 1)).encode(), [""], [], [])])
    with pytest.raises(ValueError, match="no score or sketch"):
        apply_chunk(apply_script(client), keys, batch, "visits", "visits:0:0", SESSION_ROWS, [scored])
    assert not client.exists(keys.segment_rows(BASE, "visits"))
    with pytest.raises(ValueError, match="session_spec"):
        measure_spec(VIEW)
