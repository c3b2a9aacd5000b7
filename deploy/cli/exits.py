"""A command's exit status, and how it reports an error: one red line, no traceback."""

from __future__ import annotations

from rich.markup import escape

from deploy.terminal import console

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def report(error: Exception) -> None:
    console.print(f"[red]error:[/] {escape(str(error))}")
