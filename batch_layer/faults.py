"""Injected faults for the kill tests: ``LAMBDA_FAULT_POINTS=after-gold,before-flip`` kills the
process (SIGKILL, no cleanup) when it reaches a named point. Unset in production: a no-op.

Points: ``after-gold`` and ``before-flip`` (batch run), ``speed-after-write`` (speed layer: a
micro-batch's increments are in Redis but Spark has not committed its offsets).
"""

from __future__ import annotations

import logging
import os
import signal

log = logging.getLogger(__name__)


def fault_point(name: str) -> None:
    """Die here, as ``kill -9`` would, if ``name`` is listed in ``LAMBDA_FAULT_POINTS``."""
    if name in os.environ.get("LAMBDA_FAULT_POINTS", "").split(","):
        log.warning("injected fault: killing the process at %r", name)
        os.kill(os.getpid(), signal.SIGKILL)
