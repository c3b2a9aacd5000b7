"""Graceful stops: SIGTERM and Ctrl-C set an event that long-running commands watch; one-shot commands unwind.

A long-running command (``stop_on_signals``) finishes its current step and returns. A one-shot
command gets an exception in its main thread instead, KeyboardInterrupt for Ctrl-C (Python's own)
and ``Terminated`` for SIGTERM (``unwind_on_signals``), so every ``finally`` on the way out runs:
the embedded Redis it started is stopped, for one. Such an exception raised where Python cannot
propagate it (a ``__del__``, an at-fork hook: it would be printed as "Exception ignored" and lost)
is raised again, by the same signal. A cleanup that must finish runs under ``signals_held``.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import CodeType, FrameType

_STOPS = (signal.SIGTERM, signal.SIGINT)


class Terminated(BaseException):  # a BaseException, as KeyboardInterrupt: `except Exception` lets it through
    """SIGTERM arrived: raised in the main thread so the command unwinds through its cleanups."""


def stop_on_signals() -> threading.Event:
    """An event set by SIGTERM or SIGINT (from now on, in this process). Call from the main thread."""
    stop = threading.Event()
    for sig in _STOPS:
        signal.signal(sig, lambda *_: stop.set())
    return stop


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise Terminated(f"stopped by {signal.Signals(signum).name}")


def unwind_on_signals() -> None:
    """From now on SIGTERM raises ``Terminated`` in the main thread (until ``stop_on_signals`` takes over),
    and an interrupt lost in a ``__del__`` or hook is delivered again. Does nothing outside the main thread,
    where signals cannot be handled."""
    global _print_unraisable
    if threading.current_thread() is not threading.main_thread():
        return
    signal.signal(signal.SIGTERM, _terminate)
    if sys.unraisablehook is not _redeliver:
        _print_unraisable, sys.unraisablehook = sys.unraisablehook, _redeliver


_print_unraisable = sys.unraisablehook


def _redeliver(unraisable: sys.UnraisableHookArgs) -> None:
    """An interrupt Python could only print (raised by a signal handler inside a ``__del__``, say): send its
    signal again, so the handler raises it where it unwinds the command. Anything else: printed as ever."""
    for kind, signum in ((Terminated, signal.SIGTERM), (KeyboardInterrupt, signal.SIGINT)):
        if issubclass(unraisable.exc_type, kind):
            threading.Thread(target=_send_once_returned, args=(signum,), name="signal-redelivery", daemon=True).start()
            return
    _print_unraisable(unraisable)


def _send_once_returned(signum: int) -> None:
    """Send ``signum`` to the main thread (so a sleep or a read there wakes up) once this hook has returned there.
    Handled while the hook still runs, the signal would raise inside it, where Python drops the exception for
    good ("Exception ignored in sys.unraisablehook"): a fixed 10 ms wait lost it under load (2 runs in 60)."""
    main = threading.main_thread().ident
    assert main is not None
    while _on_stack(_redeliver.__code__, main):
        time.sleep(0.001)
    signal.pthread_kill(main, signum)


def _on_stack(code: CodeType, thread: int) -> bool:
    frame = sys._current_frames().get(thread)  # the one way to see another thread's stack
    while frame is not None:
        if frame.f_code is code:
            return True
        frame = frame.f_back
    return False


@contextmanager
def signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM arriving while the block runs take effect when it ends, once it has finished
    (a second Ctrl-C cannot cut a cleanup short). Outside the main thread the block just runs."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, _: caught.append(signum)) for sig in _STOPS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        for signum in dict.fromkeys(caught):
            signal.raise_signal(signum)
