"""The command line end to end, as a user runs it: their own pipeline module, the embedded Redis.

`batch run` keeps the JVM's lines (Spark's WARN lines, the JVM's own warnings) out of the terminal
and in `DATA_DIR/logs/batch.log` (mode 0600), and stops the embedded Redis it started when it is
done. A deprecated Spark setting (`spark.cache.class`) makes the JVM print one known WARN line.

Oracle: plain-Python counts of the events the test wrote.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from deploy.runtime.redis_server import embedded_redis_url, ping, stop_embedded_redis
from tests.support import (
    CLICKS_PIPELINE,
    JVM_LINE,
    NOISY_SPARK_CONF,
    NOISY_SPARK_WARN,
    free_port,
    run_cli,
    wait_for,
    web,
)

pytestmark = [pytest.mark.slow, pytest.mark.uses_jvm_subprocess]

def test_user_pipeline_end_to_end(tmp_path: Path) -> None:
    (tmp_path / "user_pipes").mkdir()
    (tmp_path / "user_pipes" / "__init__.py").write_text("")
    (tmp_path / "user_pipes" / "clicks.py").write_text(CLICKS_PIPELINE)
    data_dir = tmp_path / "data"
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAMBDA_")}
    env.update({
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(Path.cwd()), env.get("PYTHONPATH", "")]),
        "LAMBDA_DATA_DIR": str(data_dir), "LAMBDA_PIPELINE": "user_pipes.clicks",
        "LAMBDA_SPARK_MASTER": "local[2]", "LAMBDA_HTTP_PORT": str(port), "LAMBDA_SPARK_CONF": NOISY_SPARK_CONF,
    })
    events = [{"page": f"/{s}/p{i}", "ms_on_page": i * 10} for i, s in enumerate(["news", "sport", "news", "tech"] * 5)]
    (tmp_path / "clicks.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (tmp_path / "bad.jsonl").write_text('{"page": "/a", "ms_on_page": 1}\n{"page": "/b", "ms_on_page": "soon"}\n')

    bad = run_cli(env, "ingest", str(tmp_path / "bad.jsonl"))
    assert bad.returncode == 1
    assert "line 2" in bad.stderr and "ms_on_page" in bad.stderr and "nothing was written" in bad.stderr

    ok = run_cli(env, "ingest", str(tmp_path / "clicks.jsonl"))
    assert ok.returncode == 0, ok.stderr
    assert "ingested 20 events" in ok.stderr

    try:
        run = run_cli(env, "batch", "run")
        assert run.returncode == 0, run.stderr
        assert "page_views" in run.stdout and "20 events recomputed" in run.stdout
        assert not any(jvm in run.stderr for jvm in JVM_LINE), run.stderr
        log = data_dir / "logs" / "batch.log"
        assert NOISY_SPARK_WARN in log.read_text() and oct(log.stat().st_mode & 0o777) == "0o600"
        redis_dir = data_dir.resolve() / "redis"
        wait_for(lambda: not ping(embedded_redis_url(redis_dir)), "the batch run's embedded Redis to stop", 60)

        server = subprocess.Popen([sys.executable, "-m", "deploy.cli", "serve"], env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            base = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 60
            while True:
                try:
                    if web.get(f"{base}/readyz").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, "the API did not become ready"
                time.sleep(0.2)
            counts = Counter(e["page"].split("/")[1] for e in events)
            sums = Counter()
            for e in events:
                sums[e["page"].split("/")[1]] += e["ms_on_page"]
            for section, count in counts.items():
                body = web.get(f"{base}/v1/views/page_views/keys/{section}").json()
                assert body["value"] == {"count": count, "sum_ms_on_page": sums[section]}
        finally:
            server.terminate()
            server.wait(20)
    finally:
        stop_embedded_redis(data_dir / "redis")
