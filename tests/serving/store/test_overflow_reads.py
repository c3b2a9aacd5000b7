"""An overflowed sum, stored as the writers store it, reads as "overflow" and is never ranked by a top-N.

A generation's rows are written in a real Redis as the batch publish spells them (an overflowed
sum's part as ``1e999``, ``serving.store.columns.OVERFLOW_JSON``), its realtime segment's scores as
the speed layer writes them (``inf``). A top-N, by the threshold merge and by reading every realtime
row, must equal a plain-Python oracle that leaves out the keys whose merged sum is not finite: no
overflowed key takes one of the n places. A key read answers the string "overflow", never a number.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
from typing import Any

import pytest

from serving.api.queries import key_answer, top_answer
from serving.store import reads
from serving.store.columns import OVERFLOW_JSON
from serving.store.connection import redis_client, store_keys
from serving.store.generation_meta import GenerationMeta
from serving.store.reader import ServingStore
from serving.store.session import PipelineStore
from shared_logic import Count, Sum, View

VIEW = View("probe", keys=("k",), measures=(Count(), Sum("x")))
MEASURES = ["count", "sum_x"]
GENERATION, PROCESSED = 5, 9


def _data(seed: int) -> tuple[dict[str, float], dict[str, float]]:
    """Batch and realtime sums per key; some of either are +inf (overflowed), among the highest others."""
    rng = random.Random(seed)
    batch = {f"k{i:02d}": rng.choice([-2.0, 1.0, 5.0, 8.5, 9.0]) for i in range(60)}
    realtime = {k: rng.choice([0.5, 3.0, 7.0]) for k in rng.sample(sorted(batch), 20)} | {"new": 4.0}
    for k in rng.sample(sorted(batch), 6):
        batch[k] = math.inf
    for k in rng.sample(sorted(realtime), 4) + ["late"]:
        realtime[k] = math.inf
    return batch, realtime


def _publish(url: str, batch: dict[str, float], realtime: dict[str, float]) -> None:
    client, keys = redis_client(url), store_keys("probe", url)
    store = PipelineStore(client, keys)
    epoch = store.ensure_epoch()
    store.generations.begin(GENERATION, epoch)
    for key, total in batch.items():
        spelled = OVERFLOW_JSON if math.isinf(total) else repr(total)
        client.hset(keys.rows(GENERATION, "probe"), key, f"[1.0,{spelled}]")
    assert store.generations.flip(GENERATION, epoch, GenerationMeta(measures={"probe": MEASURES}))
    client.hset(keys.segment_meta(GENERATION), "processed", PROCESSED)
    for key, total in realtime.items():
        client.hset(keys.segment_rows(GENERATION, "probe"), key, json.dumps(["1.0", repr(total)]))
        client.zadd(keys.segment_scores(GENERATION, "probe", "sum_x"), {key: total})
        client.zadd(keys.segment_scores(GENERATION, "probe", "count"), {key: 1.0})


def _oracle(batch: dict[str, float], realtime: dict[str, float], n: int) -> list[tuple[str, float]]:
    merged = {k: batch.get(k, 0.0) + realtime.get(k, 0.0) for k in batch.keys() | realtime.keys()}
    return sorted(((k, v) for k, v in merged.items() if math.isfinite(v)), key=lambda kv: (-kv[1], kv[0]))[:n]


@pytest.mark.parametrize("merge", ["threshold", "every realtime row"])
def test_overflowed_sums_are_never_ranked_and_read_as_overflow(redis_url: str, merge: str,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reads, "SMALL_SEGMENT", 0 if merge == "threshold" else 1_000)
    batch, realtime = _data(seed=3)
    _publish(redis_url, batch, realtime)

    async def answers() -> tuple[dict[int, list[tuple[str, Any]]], dict[str, Any]]:
        reader = ServingStore(redis_url, "probe")
        try:
            tops = {n: [(e.key, e.value) for e in (await top_answer(reader, VIEW, "sum_x", n, None)).top]
                    for n in (1, 3, 10, 100)}
            values = {k: (await key_answer(reader, VIEW, k)).value for k in ("late", *sorted(batch))}
        finally:
            await reader.close()
        return tops, values

    tops, values = asyncio.run(answers())
    for n, got in tops.items():
        assert got == _oracle(batch, realtime, n), f"top {n}"
    for key, value in values.items():
        overflowed = math.isinf(batch.get(key, 0.0) + realtime.get(key, 0.0))
        assert (value["sum_x"] == "overflow") == overflowed and value["sum_x"] is not None, (key, value)
