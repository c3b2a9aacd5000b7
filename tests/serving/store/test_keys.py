"""The Lua twins of the Redis key names build the same names as ``Keys``.

Scripts cannot ask Python for a key name, so ``serving.store.keys`` spells each name twice: a
``Keys`` method and a Lua function in ``LUA_NAMES`` / ``LUA_RUN_NAMES``. Each Lua function runs
here in a real Redis (EVAL, arguments as strings, as scripts receive them in ARGV or read them
from Redis) and must answer what its ``Keys`` method answers, for several pipelines, views,
measures, windows, generations, segment bases, rows and runs. Every function of both tables is
covered (a new twin without a case fails ``test_every_twin_is_checked``).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
import redis

from serving.store.keys import LUA_NAMES, LUA_RUN_NAMES, Keys, decode_key, encode_field, encode_key, suffix

PIPELINES = ["wordcount", "payments", "acme_clicks-2"]
VIEWS = ["word_counts", "spend_by_user_per_minute"]
MEASURES = ["count", "sum_amount", "distinct_merchant"]
WINDOWS: list[int | None] = [None, 0, 1_700_000_040]
GENERATIONS = [1, 42, 9_007_199_254_740_993]  # the last: past a double's exact integers (names join strings)
FIELDS = [encode_field("alice"), encode_field(("a|b", "c\\d"), 60), encode_field("ünï cödé", 1_700_000_040)]
RUN_IDS = ["0123456789ab", "x"]


@dataclass(frozen=True)
class Twin:
    """One Lua function called with ``args`` and the name ``Keys`` gives for the same thing."""

    table: str  # LUA_NAMES or LUA_RUN_NAMES
    function: str
    args: tuple[str, ...]
    expected: str


def _name_twins(keys: Keys) -> Iterator[Twin]:
    p = keys.prefix
    yield Twin("LUA_NAMES", "scratch_key", (p,), keys.scratch)
    yield Twin("LUA_NAMES", "top_seen_key", (p, "0f3a"), keys.top_seen("0f3a"))
    for g in GENERATIONS:
        yield Twin("LUA_NAMES", "generation_meta", (p, str(g)), keys.meta(g))
        yield Twin("LUA_NAMES", "segment_meta", (p, str(g)), keys.segment_meta(g))
        for view in VIEWS:
            gp, sp = keys.view_prefix(g, view), keys.segment_view_prefix(g, view)
            yield Twin("LUA_NAMES", "generation_view", (p, str(g), view), gp)
            yield Twin("LUA_NAMES", "segment_view", (p, str(g), view), sp)
            for ws in WINDOWS:
                sfx = suffix(ws)
                yield Twin("LUA_NAMES", "rows_key", (gp, sfx), keys.rows(g, view, ws))
                yield Twin("LUA_NAMES", "index_key", (gp, sfx), keys.key_index(g, view, ws))
                yield Twin("LUA_NAMES", "undo_key", (sp, sfx), keys.segment_undo(g, view, ws))
                yield Twin("LUA_NAMES", "undo_tag_key", (sp, sfx), keys.segment_undo_tag(g, view, ws))
                yield Twin("LUA_NAMES", "undo_copies_key", (sp, sfx), keys.segment_undo_copies(g, view, ws))
                for measure in MEASURES:
                    yield Twin("LUA_NAMES", "scores_key", (gp, measure, sfx), keys.scores(g, view, measure, ws))
                    yield Twin("LUA_NAMES", "scores_key", (sp, measure, sfx), keys.segment_scores(g, view, measure, ws))
            for measure, field in itertools.product(MEASURES, FIELDS):
                yield Twin("LUA_NAMES", "sketch_key", (gp, measure, field), keys.sketch(g, view, measure, field))
                yield Twin("LUA_NAMES", "sketch_key", (sp, measure, field), keys.segment_sketch(g, view, measure, field))
                yield Twin("LUA_NAMES", "previous_key", (sp, measure, field),
                           keys.segment_previous(g, view, measure, field))


def _run_twins(keys: Keys) -> Iterator[Twin]:
    P = keys.batch_prefix
    yield Twin("LUA_RUN_NAMES", "runs_key", (P,), keys.batch_runs)
    yield Twin("LUA_RUN_NAMES", "queue_key", (P,), keys.batch_queue)
    yield Twin("LUA_RUN_NAMES", "lease_key", (P,), keys.batch_lease)
    yield Twin("LUA_RUN_NAMES", "active_key", (P,), keys.batch_active)
    for run_id in RUN_IDS:
        yield Twin("LUA_RUN_NAMES", "run_key", (P, run_id), keys.batch_run(run_id))


TABLES = {"LUA_NAMES": LUA_NAMES, "LUA_RUN_NAMES": LUA_RUN_NAMES}
TWINS: dict[str, Callable[[Keys], Iterator[Twin]]] = {"LUA_NAMES": _name_twins, "LUA_RUN_NAMES": _run_twins}


def _lua_functions(source: str) -> set[str]:
    return set(re.findall(r"^local function (\w+)\(", source, flags=re.MULTILINE))


def test_every_twin_is_checked() -> None:
    keys = Keys(PIPELINES[0])
    for table, source in TABLES.items():
        checked = {twin.function for twin in TWINS[table](keys)}
        assert checked == _lua_functions(source), f"{table}: Lua functions without a case, or cases without one"


@pytest.mark.parametrize("table", sorted(TABLES))
@pytest.mark.parametrize("pipeline", PIPELINES)
def test_lua_twins_build_the_names_keys_builds(redis_url: str, pipeline: str, table: str) -> None:
    keys = Keys(pipeline)
    twins = list(TWINS[table](keys))
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        scripts = {
            name: client.register_script(f"{TABLES[table]}\nreturn {name}(unpack(ARGV))")
            for name in {twin.function for twin in twins}
        }
        answers = [scripts[twin.function](args=list(twin.args)) for twin in twins]
    finally:
        client.close()
    wrong = [(twin.function, twin.args, answer, twin.expected)
             for twin, answer in zip(twins, answers) if answer != twin.expected]
    assert not wrong, f"{len(wrong)} of {len(twins)} Lua names differ from Keys', e.g. {wrong[:3]}"


@pytest.mark.parametrize("values", [("a|b", "c"), ("a", "b|c"), ("x\\", "|"), ("", ""), ("JFK", "LAX", "\\|\\")])
def test_decode_key_undoes_encode_key(values: tuple[str, ...]) -> None:
    assert decode_key(encode_key(values), len(values)) == values


def test_decode_key_refuses_a_key_of_other_columns() -> None:
    with pytest.raises(ValueError):
        decode_key("a|b|c", 2)
    assert decode_key("a|b", 1) == ("a|b",)
