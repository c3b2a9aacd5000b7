"""What the command line shows: one progress display for one-shot commands, log lines for services.

* One-shot commands (``ingest``, ``batch run``, ``status``) print their result once. While they
  work, the platform's INFO log records become the text of a single transient status line on a
  terminal (and are not shown elsewhere); warnings and errors are printed as lines. ``-v`` shows
  every record as a line too.
* Long-running commands (``serve``, ``speed run``, ``batch schedule``, ``generate``, ``up``) log
  one line per record: coloured on a terminal, plain ``time level logger: message`` otherwise
  (``up`` writes its children's output to files under ``DATA_DIR/logs``).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.logging import RichHandler
from rich.markup import escape
from rich.status import Status

#: Messages and progress (stderr); results go to stdout (``out``).
console = Console(stderr=True, soft_wrap=True)
out = Console(soft_wrap=True)

_NOISY = ("py4j", "httpx", "httpcore", "asyncio")


class _ProgressHandler(logging.Handler):
    """INFO records update the current status line; WARNING and above go to ``lines``."""

    def __init__(self, lines: logging.Handler, *, verbose: bool) -> None:
        super().__init__(logging.DEBUG)
        self.lines, self.verbose = lines, verbose
        self.status: Status | None = None
        self.title = ""

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.WARNING or self.verbose:
            self.lines.handle(record)
        elif self.status is not None:
            self.status.update(f"{self.title}: {escape(record.getMessage())}")


_progress: _ProgressHandler | None = None


def _line_handler(verbose: bool) -> logging.Handler:
    if console.is_terminal:
        return RichHandler(console=console, show_path=False, rich_tracebacks=verbose, log_time_format="[%X]")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    return handler


def configure_logging(*, verbose: bool, one_shot: bool) -> None:
    """Route log records for a one-shot command (progress) or a long-running one (lines)."""
    global _progress
    lines = _line_handler(verbose)
    handler: logging.Handler = lines
    _progress = None
    if one_shot:
        _progress = _ProgressHandler(lines, verbose=verbose)
        handler = _progress
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    for noisy in _NOISY:
        logging.getLogger(noisy).setLevel(logging.WARNING)


@contextmanager
def progress(title: str) -> Iterator[None]:
    """Show ``title`` (and the latest INFO record) on one transient status line while the block runs."""
    if _progress is None or not console.is_terminal:
        yield
        return
    with console.status(escape(title)) as status:
        _progress.status, _progress.title = status, escape(title)
        try:
            yield
        finally:
            _progress.status = None
