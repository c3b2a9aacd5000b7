"""Segment claims and the speed layer's wait, on a real Redis: the rules of ``serving.store.logic`` as stated
(through the store session, ``PipelineStore``).

* The first writer claims a segment; the speed layer writes only segments claimed for its logic and
  query; the batch may flip over a segment its logic holds (any query of it), never another's.
* A served generation of another logic (or none recorded) refuses every speed-layer claim.
* A generation served of the logic the speed layer waits for ends the wait; another logic's does not.
"""

from __future__ import annotations

import redis

from serving.store.keys import Keys
from serving.store.session import PipelineStore


def test_claims_keep_logics_and_queries_apart(redis_url: str) -> None:
    client, keys = redis.Redis.from_url(redis_url), Keys("p")
    store = PipelineStore(client, keys)
    assert store.claim_segment(5, "A") is None, "the batch claims an unclaimed segment"
    assert store.claim_segment(5, "A", "q1") is None, "a query of the batch's logic takes it over"
    assert store.claim_segment(5, "A", "q1") is None, "and keeps it"
    assert store.claim_segment(5, "A", "q2") == "segment:A/q1", "another query of the same logic may not"
    assert store.claim_segment(5, "B", "q3") == "segment:A/q1"
    assert store.claim_segment(5, "A") is None, "the batch of logic A may flip over A's query"
    assert store.claim_segment(5, "B") == "segment:A/q1", "the batch of logic B may not"
    assert 5 in {int(b) for b in client.smembers(keys.segments)}, "a claimed segment is indexed (dropped with the rest)"


def test_a_generation_served_under_other_logic_refuses_the_speed_layer(redis_url: str) -> None:
    client, keys = redis.Redis.from_url(redis_url), Keys("p")
    store = PipelineStore(client, keys)
    client.hset(keys.meta(7), mapping={"version": 7, "logic": "A"})
    assert store.claim_segment(7, "B", "q") == "generation:A"
    client.hset(keys.meta(8), mapping={"version": 8})  # published before logic was recorded
    assert store.claim_segment(8, "A", "q") == "generation:"
    assert store.claim_segment(7, "A", "q") is None


def test_a_generation_of_the_awaited_logic_ends_the_wait(redis_url: str) -> None:
    store = PipelineStore(redis.Redis.from_url(redis_url), Keys("p"))
    store.mark_waiting("A")
    store.satisfy_waiting("B")
    assert store.waiting_for() == "A", "a generation of other logic leaves the wait as it is"
    store.satisfy_waiting("A")
    assert store.waiting_for() is None
    store.mark_waiting("A")
    store.mark_waiting(None)
    assert store.waiting_for() is None
