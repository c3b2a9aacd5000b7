"""Real servers for tests: a redis-server process and a uvicorn server in a thread, each on a free port."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import redis

from deploy.runtime.redis_server import redis_binary
from tests.support import free_port


class RedisServer:
    """A real redis-server process on a free port, restartable (for fault tests)."""

    def __init__(self, workdir: Path) -> None:
        self.workdir, self.port = workdir, free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, *, appendonly: bool = False) -> None:
        """Start (or restart, same port and data) the server; ``appendonly`` persists every write (AOF)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        persistence = ["--appendonly", "yes", "--appendfsync", "always"] if appendonly else ["--appendonly", "no"]
        self.process = subprocess.Popen(
            [str(redis_binary()), "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.workdir),
             "--save", "", *persistence],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if redis.Redis.from_url(self.url).ping():
                    return
            except redis.ConnectionError:
                time.sleep(0.05)
        raise RuntimeError(f"redis-server did not start on port {self.port}")

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(10)
            self.process = None


class ApiServer:
    """A real uvicorn server running the app in a thread, on a free port."""

    def __init__(self, app: Any) -> None:
        import uvicorn

        from serving.api.http_protocol import JsonErrorHttpProtocol

        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self._server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                        http=JsonErrorHttpProtocol))
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    def __enter__(self) -> ApiServer:
        self._thread.start()
        deadline = time.monotonic() + 15
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(10)
