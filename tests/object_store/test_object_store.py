"""The master dataset on S3 through delta-rs: locations, the Delta-log reader, concurrent commits, secrets.

Against a real S3 server on loopback (moto, see conftest.py); the oracle reads the table with its
own delta-rs handle.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pyarrow as pa
import pytest

from batch_layer.master.dataset import MasterDataset, dump_jsonl
from batch_layer.master.delta_log import LogHead, change_feed, newest_version, read_commit
from batch_layer.master.object_store import (
    is_object_store,
    join,
    relative,
    spark_uri,
    storage_options,
    table_uri,
)
from deploy.cli.main import run
from shared_logic import load_pipeline
from tests import oracle
from tests.support.s3 import SECRET

PIPELINE = "payments"


def _events(n: int, user: str = "u") -> list[dict[str, object]]:
    return [{"user_id": f"{user}{i % 5}", "amount": round(1.5 * i, 2), "merchant": "shop",
             "event_time": f"2024-03-01T{i % 24:02d}:00:00Z"} for i in range(n)]


def test_locations_are_uris(tmp_path: Path) -> None:
    assert table_uri("s3a://bucket/a/b/") == "s3://bucket/a/b"
    assert table_uri(f"file://{tmp_path}/t") == str(tmp_path / "t")
    assert table_uri(tmp_path / "t") == str(tmp_path / "t")
    assert join("s3://bucket/a", "master", "x") == "s3://bucket/a/master/x"
    assert join(tmp_path, "master") == str(tmp_path / "master")
    assert relative("s3://b/t/gen-1/part-0.parquet", "s3://b/t") == "gen-1/part-0.parquet"
    assert spark_uri("s3://b/t") == "s3a://b/t" and spark_uri(tmp_path) == str(tmp_path)
    assert is_object_store("s3://b/t") and not is_object_store(tmp_path)
    assert storage_options(tmp_path) == {}


def test_master_dataset_on_s3(s3_settings, tmp_path: Path) -> None:
    settings = s3_settings(pipeline=PIPELINE)
    assert storage_options(settings.master_uri) == {"conditional_put": "etag", "allow_http": "true"}
    master = MasterDataset.open(settings, load_pipeline(PIPELINE))
    file = tmp_path / "events.jsonl"
    dump_jsonl(_events(40), file)
    first = master.ingest_file(file)
    barrier = master.append_barrier("run-1")
    appender = master.appender()
    later = appender.append(pa.Table.from_pylist(
        [{**e, "event_time": None, "_kind": "event"} for e in _events(3, "late")], schema=master.schema))

    assert settings.master_uri.startswith("s3://") and not (settings.data_dir / "master").exists()
    assert newest_version(settings.master_uri) == later == barrier + 1 == first.version + 2
    assert LogHead(settings.master_uri).version() == later
    commit = read_commit(settings.master_uri, barrier)
    assert commit is not None and commit.info.get("lambda.barrier") == "run-1"
    assert read_commit(settings.master_uri, later + 1) is None
    assert sum(b.num_rows for b in change_feed(settings.master_uri, first.version, first.version)) == 40
    stored = oracle.read_events(settings.master_uri)  # the oracle's own delta-rs handle
    assert sorted(e["user_id"] for e in stored) == sorted(str(e["user_id"]) for e in [*_events(40), *_events(3, "late")])


@pytest.mark.slow  # over 4 s: the full tier (the quick tier has a 3-minute budget)
def test_concurrent_commits_on_s3_lose_nothing(s3_settings, s3_server) -> None:
    """Writers racing for the same versions: the server refuses the losers' commit puts (412,
    conditional put), delta-rs retries them at the next version, and every row lands exactly once."""
    settings = s3_settings(pipeline=PIPELINE)
    master = MasterDataset.open(settings, load_pipeline(PIPELINE))
    master.ensure()
    writers, appends = 3, 5
    errors: list[BaseException] = []
    start = threading.Barrier(writers)

    def write(w: int) -> None:
        engine = MasterDataset.open(settings, load_pipeline(PIPELINE))
        start.wait()
        try:
            for i in range(appends):
                rows = [{**e, "user_id": f"w{w}-{i}", "event_time": None, "_kind": "event"} for e in _events(1)]
                engine.append(pa.Table.from_pylist(rows, schema=master.schema))
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    users = sorted(e["user_id"] for e in oracle.read_events(settings.master_uri))
    assert users == sorted(f"w{w}-{i}" for w in range(writers) for i in range(appends))
    assert newest_version(settings.master_uri) == writers * appends
    bucket = settings.master_uri.split("/")[2]
    refused = s3_server.requests(f"PUT /{bucket}/") and [
        line for line in s3_server.requests(f"/{bucket}/") if "_delta_log/" in line and '" 412' in line]
    assert refused, "no commit was refused: the writers never raced (the test proved nothing)"


def test_secret_never_shown(s3_settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                            capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    settings = s3_settings(pipeline=PIPELINE)
    assert SECRET not in repr(settings) and SECRET not in str(settings)
    assert SECRET not in settings.model_dump_json()
    for name, value in {"LAMBDA_TABLES_URI": settings.tables_uri, "LAMBDA_S3_ENDPOINT_URL": settings.s3_endpoint_url,
                        "LAMBDA_S3_ACCESS_KEY_ID": settings.s3_access_key_id, "LAMBDA_S3_SECRET_ACCESS_KEY": SECRET,
                        "LAMBDA_DATA_DIR": str(settings.data_dir), "LAMBDA_REDIS_URL": settings.redis_url,
                        "LAMBDA_PIPELINE": PIPELINE, "LAMBDA_ENV_FILE": "/dev/null"}.items():
        monkeypatch.setenv(name, str(value))
    file = tmp_path / "events.jsonl"
    dump_jsonl(_events(5), file)
    caplog.set_level("DEBUG")
    assert run(["-v", "ingest", str(file)]) == 0
    ingest = capsys.readouterr()
    run(["status", "--json"])
    shown = capsys.readouterr()
    status = json.loads(shown.out)
    assert status["parts"][0]["detail"].startswith("latest version")
    with pytest.raises(SystemExit):
        run(["--help"])
    monkeypatch.setenv("LAMBDA_S3_ENDPOINT_URL", "ftp://nowhere")  # a settings error names the variable only
    assert run(["status"]) == 2
    error = capsys.readouterr()
    output = "".join([ingest.out, ingest.err, shown.out, shown.err, error.out, error.err, caplog.text])
    assert "LAMBDA_S3_ENDPOINT_URL" in output
    assert SECRET not in output


def test_s3a_jars_only_for_s3_tables_and_never_the_sdk_bundle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from batch_layer.master.engines import engine_spark_conf

    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9000")
    local = engine_spark_conf("delta-rs", ivy_dir=tmp_path, snapshot_partitions=2, tables=tmp_path)
    assert local == {}, "no S3A jars for local tables"
    for engine in ("delta-rs", "delta-spark"):
        conf = engine_spark_conf(engine, ivy_dir=tmp_path, snapshot_partitions=2, tables="s3://bucket/prefix")
        packages, excludes = conf["spark.jars.packages"].split(","), conf["spark.jars.excludes"].split(",")
        assert "org.apache.hadoop:hadoop-aws:3.5.0" in packages
        assert "software.amazon.awssdk:bundle" in excludes and not any("bundle" in p for p in packages)
        assert conf["spark.jars.ivy"] == str(tmp_path.resolve())
        assert conf["spark.hadoop.fs.s3a.endpoint"] == "http://127.0.0.1:9000"
        assert conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "false"
        assert not any("secret" in key.lower() or SECRET in value for key, value in conf.items())


def test_up_hands_its_children_the_secret_itself_not_its_mask(s3_settings) -> None:
    """``up`` passes every setting to its children as LAMBDA_* variables: the S3 secret must arrive as
    the secret (a SecretStr's str() is its mask, with which every child would fail to authenticate)."""
    from deploy.supervision.launcher import _env

    settings = s3_settings(pipeline=PIPELINE)
    env = _env(settings, str(settings.redis_url))
    assert env["LAMBDA_S3_SECRET_ACCESS_KEY"] == SECRET
    assert env["LAMBDA_TABLES_URI"] == settings.tables_uri


@pytest.mark.slow  # over 2.5 s in a full run: the full tier (the quick tier has a 3-minute budget)
def test_speed_layer_source_reads_the_master_on_s3(s3_settings) -> None:
    """The speed layer's Python streaming source (delta-rs engine) plans and reads versions of a
    master dataset on S3: offsets, the row cap from the commits' statistics, the rows with ``_version``
    (called as Spark calls it on the driver and the executors, without a JVM)."""
    from pyspark.sql.streaming.datasource import ReadMaxRows

    from speed_layer.source import MasterChangesReader, master_schema_option

    settings = s3_settings(pipeline=PIPELINE)
    master = MasterDataset.open(settings, load_pipeline(PIPELINE))
    versions = [master.append(pa.Table.from_pylist(
        [{**e, "user_id": f"v{i}", "event_time": None, "_kind": "event"} for e in _events(2)], schema=master.schema))
        for i in range(3)]
    reader = MasterChangesReader({"path": settings.master_uri, "schema_json": master_schema_option(master.schema)})
    assert reader.reportLatestOffset() == {"version": versions[-1]}
    end = reader.latestOffset({"version": 0}, ReadMaxRows(4))
    assert end["version"] == versions[1], "the row cap (4 rows = 2 commits) read from S3 commit statistics"
    assert end["summary"] == {"last": versions[1], "barriers": [], "first": versions[0], "rows": 4}, (
        "the micro-batch's summary (its versions and rows), from the same statistics")
    rows = [row for part in reader.partitions({"version": 0}, end) for batch in reader.read(part)
            for row in batch.to_pylist()]
    assert sorted((r["user_id"], r["_version"]) for r in rows) == sorted(
        (f"v{i}", versions[i]) for i in range(2) for _ in range(2))
