"""The platform with its tables on S3, end to end, on both storage engines.

``lambda-platform ingest`` and ``lambda-platform batch run`` run as subprocesses (their own Spark
driver with Hadoop's S3A connector) against moto's S3 server on loopback, configured only through
LAMBDA_* settings; then every key of every view answered over HTTP equals the oracle, which reads
the master dataset from S3 with its own delta-rs handle. Nothing of the tables is written locally,
and the secret appears in no output.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from batch_layer.master.dataset import dump_jsonl
from batch_layer.master.delta_log import newest_version
from batch_layer.master.object_store import join
from deploy.settings import Settings
from serving.api.app import create_app
from shared_logic import load_pipeline
from tests import oracle
from tests.support.s3 import SECRET
from tests.support.servers import ApiServer
from tests.support.speed import assert_exact

pytestmark = [pytest.mark.slow, pytest.mark.uses_jvm_subprocess]

PIPELINE = "payments"


def _env(settings: Settings) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LAMBDA_", "AWS_"))}
    env.update({
        "LAMBDA_ENV_FILE": os.devnull, "LAMBDA_DATA_DIR": str(settings.data_dir), "LAMBDA_PIPELINE": PIPELINE,
        "LAMBDA_REDIS_URL": str(settings.redis_url), "LAMBDA_SPARK_MASTER": "local[2]",
        "LAMBDA_SPARK_SHUFFLE_PARTITIONS": "2", "LAMBDA_STORAGE_ENGINE": settings.storage_engine,
        "LAMBDA_TABLES_URI": str(settings.tables_uri), "LAMBDA_S3_ENDPOINT_URL": str(settings.s3_endpoint_url),
        "LAMBDA_S3_REGION": "us-east-1", "LAMBDA_S3_ACCESS_KEY_ID": str(settings.s3_access_key_id),
        "LAMBDA_S3_SECRET_ACCESS_KEY": SECRET,
        # No class-data-sharing archive: no other JVM of the suite has the S3A jar sets, so the one `batch run`
        # that would write theirs pays the dump (a core for 30-60 s at its exit) for nothing.
        "LAMBDA_SPARK_CLASS_ARCHIVE_DIR": "",
    })
    return env


def _cli(env: dict[str, str], *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "deploy.cli", "-v", *args], env=env, capture_output=True,
                          text=True, timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert SECRET not in output, "the S3 secret was printed"
    return output


@pytest.mark.parametrize("engine", ["delta-rs", "delta-spark"])
def test_ingest_and_batch_run_on_s3_are_exact(engine: str, s3_settings, tmp_path: Path) -> None:
    settings = s3_settings(pipeline=PIPELINE, storage_engine=engine)
    env = _env(settings)
    events = [{"user_id": f"u{i % 7}", "merchant": f"m{i % 3}", "amount": round(0.25 * i, 2),
               "event_time": f"2024-03-01T{i % 24:02d}:{i % 60:02d}:00Z"} for i in range(300)]
    file = tmp_path / "events.jsonl"
    dump_jsonl(events, file)

    _cli(env, "ingest", str(file))
    _cli(env, "batch", "run")

    assert not (settings.data_dir / "master").exists() and not (settings.data_dir / "gold").exists()
    generation = oracle.barrier_versions(settings.master_uri)[-1]
    for view in load_pipeline(PIPELINE).views:
        assert newest_version(join(settings.gold_uri, view.name)) is not None, f"gold table {view.name} not on S3"
    assert len(oracle.read_events(settings.master_uri, generation)) == len(events)
    with ApiServer(create_app(settings, redis_url=str(settings.redis_url))) as server:
        on_s3 = SimpleNamespace(master_path=settings.master_uri, pipeline=PIPELINE)
        assert assert_exact(server.base_url, on_s3, generation, named=True) > 20  # type: ignore[arg-type]
