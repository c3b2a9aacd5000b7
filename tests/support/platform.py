"""Driving a whole `lambda-platform up` tree from a test: its admin key, waiting on it, stopping it."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Callable

import httpx
import pytest

from tests.support import wait_for, web

#: The admin key the `up` tests configure (LAMBDA_API_KEYS), every scope.
KEY = "test-admin-key-0001"


def wait_up(check: Callable[[], object], what: str, timeout: float = 240) -> None:
    """``wait_for`` while the platform's HTTP server may not listen yet."""
    wait_for(check, what, timeout, poll=0.3, ignoring=(httpx.TransportError,))


def stop_up(process: subprocess.Popen[bytes], port: int) -> None:
    """SIGTERM to `up`: it must exit 0, and nothing may listen on its port any more."""
    process.send_signal(signal.SIGTERM)
    assert process.wait(180) == 0, "up did not stop cleanly on SIGTERM"
    with pytest.raises(httpx.TransportError):
        web.get(f"http://127.0.0.1:{port}/healthz", timeout=2)
