"""A real S3-compatible server on loopback: moto's standalone server (``moto[server]``), one per session.

It stands in for AWS S3 (or MinIO, Ceph RGW...): the S3 REST API over HTTP, including conditional
puts (``If-None-Match: *`` answered 412 when the object exists), which safe Delta commits need; moto
decides those atomically only as ``s3_server.py`` beside this file runs it.
Its request log is kept, so tests can count the requests the server refused.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from deploy.settings import Settings
from tests.support import free_port, web
from tests.support.s3 import ACCESS_KEY_ID, SECRET

_SERVER = Path(__file__).with_name("s3_server.py")


@dataclass
class S3Server:
    endpoint: str
    log: Path
    process: subprocess.Popen[bytes]

    def make_bucket(self) -> str:
        """A new, empty bucket for one test."""
        import boto3

        name = f"lake-{uuid.uuid4().hex[:12]}"
        boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=ACCESS_KEY_ID,
                     aws_secret_access_key=SECRET, region_name="us-east-1").create_bucket(Bucket=name)
        return name

    def requests(self, contains: str) -> list[str]:
        """Request lines of the server's log containing ``contains``."""
        return [line for line in self.log.read_text(errors="replace").splitlines() if contains in line]


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """moto's S3 server (its conditional puts atomic) on a free loopback port, stopped at the end of the session."""
    port = free_port()
    log = tmp_path_factory.mktemp("moto") / "requests.log"
    with log.open("wb") as out:
        process = subprocess.Popen([sys.executable, str(_SERVER), "-H", "127.0.0.1", "-p", str(port)],
                                   stdout=out, stderr=subprocess.STDOUT)
    server = S3Server(f"http://127.0.0.1:{port}", log, process)
    deadline = time.monotonic() + 30
    while True:
        try:
            web.get(f"{server.endpoint}/moto-api/", timeout=1)
            break
        except httpx.HTTPError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise RuntimeError(f"moto's S3 server did not start: {log.read_text()[-2000:]}") from None
            time.sleep(0.1)
    yield server
    process.terminate()
    process.wait(10)


@pytest.fixture
def s3_settings(s3_server: S3Server, make_settings: Callable[..., Settings],
                monkeypatch: pytest.MonkeyPatch) -> Callable[..., Settings]:
    """Settings with the tables in a fresh bucket of the test server (credentials from settings),
    and this process's AWS environment set from them, as the command line does."""

    def make(**overrides: Any) -> Settings:
        bucket = s3_server.make_bucket()
        settings = make_settings(tables_uri=f"s3://{bucket}/lambda", s3_endpoint_url=s3_server.endpoint,
                                 s3_region="us-east-1", s3_access_key_id=ACCESS_KEY_ID,
                                 s3_secret_access_key=SECRET, **overrides)
        for name, value in settings.object_store_env().items():
            monkeypatch.setenv(name, value)
        return settings

    return make
