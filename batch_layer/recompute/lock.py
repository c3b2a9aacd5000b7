"""The single-flight execution lock of batch runs: one recompute of a data dir at a time.

Why a file lock and not only the registry's lease: see ``serving.store.runs``.
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path


class RunLock:
    """The single-flight execution lock: ``flock`` on a file under ``DATA_DIR/locks``.

    The lock belongs to an open file description, so two holders in one process (threads) exclude
    each other too, and the kernel drops it when the process dies. The descriptor is not inherited
    by child processes (the JVM), so it never outlives this process. Non-blocking: ``acquire``
    answers at once.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    @classmethod
    def for_pipeline(cls, data_dir: Path, pipeline_slug: str) -> RunLock:
        return cls(data_dir.resolve() / "locks" / f"batch-{pipeline_slug}.lock")

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, owner: str = "") -> bool:
        if self._fd is not None:
            raise RuntimeError(f"{self.path} is already held by this RunLock")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return False
            raise
        os.ftruncate(fd, 0)
        os.write(fd, f"{owner or os.getpid()}\n".encode())
        self._fd = fd
        return True

    def holder(self) -> str | None:
        """Who wrote the lock file last (diagnostics only; may name a process that is gone)."""
        try:
            return self.path.read_text().strip() or None
        except OSError:
            return None

    def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
