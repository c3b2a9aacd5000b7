"""Injected faults for the fault tests. Unset in production: every point is a no-op.

``LAMBDA_FAULT_POINTS=after-gold,before-flip`` kills the process (SIGKILL, no cleanup) when it
reaches a named point; it works in subprocesses and in Spark's Python workers, which inherit the
environment. ``injected(name, action)`` runs ``action`` at a point instead, in this process only
(a test's own thread: e.g. flush Redis between a batch run's barrier and its flip).

Points: ``after-barrier``, ``after-gold`` and ``before-flip`` (batch run); ``speed-after-write``
(speed layer: a micro-batch's increments are in Redis but Spark has not committed its offsets);
``speed-between-chunks`` (a speed-layer executor has applied one chunk of a micro-batch and not
the next: killing the Python worker there fails the micro-batch half applied); ``speed-after-read``
(a speed-layer writer has read the rows a chunk touches and not yet written their merged values);
``speed-dropping-segments`` (a fresh start of the speed layer has deleted its segments' metadata and
not yet their data); ``kafka-before-master``, ``kafka-after-master`` and ``kafka-after-letters`` (a Kafka
ingest micro-batch validated; its master commit made; its dead letters too, Spark's commit not yet).
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager

log = logging.getLogger(__name__)

_ACTIONS: dict[str, Callable[[], None]] = {}


def fault_point(name: str) -> None:
    """Run the action injected at ``name``; die here, as ``kill -9`` would, if it is in ``LAMBDA_FAULT_POINTS``."""
    action = _ACTIONS.get(name)
    if action is not None:
        log.warning("injected fault: running the action at %r", name)
        action()
    if name in os.environ.get("LAMBDA_FAULT_POINTS", "").split(","):
        log.warning("injected fault: killing the process at %r", name)
        os.kill(os.getpid(), signal.SIGKILL)


@contextmanager
def injected(name: str, action: Callable[[], None]) -> Iterator[None]:
    """Run ``action`` whenever this process reaches fault point ``name``, inside the block."""
    _ACTIONS[name] = action
    try:
        yield
    finally:
        _ACTIONS.pop(name, None)
