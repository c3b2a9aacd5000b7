"""The speed layer never freezes on a poison event or an overflowing sum, and leaves out what the batch does.

``tests.support.ratio_pipeline`` divides one field by another. Events on both sides of a batch
barrier hold a zero divisor (Spark's ANSI division fails) and a ratio that is infinite: the batch run
and the speed layer both leave them out, so the merged answers equal the oracle over the other events
at the version they name. Two amounts of 1.5e308 for one user overflow a double: split across the
barrier, and both after it (the realtime part alone overflows). The speed layer goes on with the next
events, says in its heartbeat how many it left out, and keeps no dead letter: the next batch run does.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from deltalake import DeltaTable

from batch_layer.master.dataset import MasterDataset
from batch_layer.master.dead_letters import DeadLetters
from batch_layer.recompute.job import run_batch
from deploy.settings import Settings
from serving.store.keys import Keys
from shared_logic.registry import load_pipeline
from tests.support import ingest_file, web
from tests.support.bad_data import answer_problems, readings
from tests.support.speed import running_speed_layer, wait_caught_up

pytestmark = pytest.mark.slow

PIPELINE = "tests.support.ratio_pipeline"
BEFORE = readings(("u1", 10.0, 2.0), ("u1", 6.0, 0.0), ("u2", 1e308, 1e-10), ("u3", 1.5e308, 1.0), ("u4", 5.0, 4.0))
AFTER = readings(("u1", 4.0, 0.0), ("u1", 8.0, 4.0), ("u2", 3.0, 1.0), ("u5", 1e308, 1e-300), ("u3", 1.5e308, 1.0),
                 ("u6", 1.5e308, 1.0), ("u6", 1.5e308, 1.0), ("u4", 1.0, 1.0))
LATER = readings(("u4", 2.0, 1.0), ("u7", 1.0, 2.0))


#: After a restart that moves the speed layer's work into Spark tasks: a zero divisor, an infinite ratio
#: (``u8`` has nothing else, so it is absent), and a new user's two amounts overflowing in the realtime part.
IN_TASKS = readings(("u1", 7.0, 0.0), ("u8", 1e308, 1e-300), ("u9", 1.5e308, 1.0), ("u9", 1.5e308, 1.0),
                    ("u2", 2.0, 1.0))
THEN = readings(("u4", 3.0, 1.0), ("u10", 1.0, 4.0))


def test_poison_and_overflow_after_the_barrier_leave_the_speed_layer_running_and_answers_exact(
        spark: Any, make_settings: Callable[..., Settings], api: Callable[..., Any], tmp_path: Path) -> None:
    """Both ways the speed layer computes a micro-batch, in turn on one master: in the driver
    (``speed_driver_rows`` above the batch's rows), then, restarted, in Spark tasks (``speed_driver_rows`` 0)."""
    settings = make_settings(pipeline=PIPELINE, speed_trigger_seconds=0.2, speed_driver_rows=10_000)
    pipeline = load_pipeline(PIPELINE)
    ingest_file(settings, BEFORE, tmp_path / "before.jsonl")
    assert run_batch(spark, settings, pipeline, redis_url=settings.redis_url).poisoned == 2
    master = MasterDataset.open(settings, pipeline)
    speed = Keys(pipeline.name).speed
    client = redis.Redis.from_url(settings.redis_url)
    in_tasks = settings.model_copy(update={"speed_driver_rows": 0})
    with api(pipeline=PIPELINE) as server, web.client(base_url=server.base_url, timeout=30) as http:
        with running_speed_layer(spark, settings, pipeline) as thread:  # in the driver
            master.append(pipeline.schema.validate(AFTER))
            version = wait_caught_up(settings, speed=thread)
            assert int(client.hget(speed, "last_batch_poisoned") or 0) == 2, client.hgetall(speed)
            assert not answer_problems(http, BEFORE + AFTER, version=version, absent=["u5"])
            assert http.get("/v1/views/ratio_by_user/keys/u6").json()["value"]["sum_amount"] == "overflow"

            master.append(pipeline.schema.validate(LATER))  # it goes on after them
            version = wait_caught_up(settings, speed=thread)
            assert not answer_problems(http, BEFORE + AFTER + LATER, version=version, absent=["u5"])

        with running_speed_layer(spark, in_tasks, pipeline) as thread:  # in Spark tasks
            master.append(pipeline.schema.validate(IN_TASKS))
            version = wait_caught_up(in_tasks, speed=thread)
            assert int(client.hget(speed, "last_batch_poisoned") or 0) == 2, client.hgetall(speed)
            everything = BEFORE + AFTER + LATER + IN_TASKS
            assert not answer_problems(http, everything, version=version, absent=["u5", "u8"])
            assert http.get("/v1/views/ratio_by_user/keys/u9").json()["value"]["sum_amount"] == "overflow"

            master.append(pipeline.schema.validate(THEN))  # it goes on after them
            version = wait_caught_up(in_tasks, speed=thread)
            assert not answer_problems(http, everything + THEN, version=version, absent=["u5", "u8"])
    assert DeadLetters.open(settings, pipeline.name).count() == 2, "the speed layer keeps no dead letters"

    again = run_batch(spark, settings, pipeline, redis_url=settings.redis_url)
    assert again.poisoned == 6 and again.generation == DeltaTable(str(settings.master_path)).version()
    assert DeadLetters.open(settings, pipeline.name).count() == 6
