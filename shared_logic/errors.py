"""Errors raised by shared_logic: bad pipeline definitions, unknown names, invalid events."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


class SharedLogicError(Exception):
    """Root of every error raised by shared_logic."""


class PipelineDefinitionError(SharedLogicError):
    """A pipeline, view or measure is declared wrongly; the message says which and how to fix it."""


class UnknownNameError(SharedLogicError, LookupError):
    """A name that is not registered (a view, a measure, a pipeline); the message lists the known ones.

    ``kind`` is a plain noun ("view", "measure"); ``owner`` names what the name was looked up in
    ("view 'page_views'"), when that is not the pipeline itself.
    """

    def __init__(self, kind: str, name: str, known: Sequence[str], *, owner: str | None = None) -> None:
        self.kind, self.name, self.known, self.owner = kind, name, tuple(known), owner
        super().__init__(self._message())

    def _message(self) -> str:
        listing = ", ".join(repr(k) for k in sorted(self.known))
        if self.owner:
            found = f"its {self.kind}s are {listing}" if listing else f"it has no {self.kind}s"
            return f"{self.owner} has no {self.kind} {self.name!r}; {found}"
        found = f"the known {self.kind}s are {listing}" if listing else f"there are no {self.kind}s"
        return f"unknown {self.kind} {self.name!r}; {found}"


class UnknownPipelineError(UnknownNameError):
    """``LAMBDA_PIPELINE`` names neither a built-in pipeline nor a module on the pipeline search path."""

    def __init__(self, name: str, builtins: Sequence[str], search_path: Sequence[str]) -> None:
        self.search_path = tuple(search_path)
        super().__init__("pipeline", name, builtins)

    def _message(self) -> str:
        where = ", then ".join(self.search_path) or "(empty)"
        return (
            f"unknown pipeline {self.name!r}: it is not a built-in pipeline ({', '.join(sorted(self.known))}) "
            f"and no module {self.name!r} was found on the pipeline search path ({where}). "
            "A pipeline is a module exposing `pipeline = YourPipeline()`: name a built-in, or the module's "
            "dotted path (`clicks` for ./clicks.py, `my_package.clicks` for ./my_package/clicks.py)"
        )


class PipelineModuleError(PipelineDefinitionError):
    """A pipeline module was found but importing it failed (syntax error, failed import, error at import)."""

    def __init__(self, module: str, file: str | None, line: int | None, error: BaseException) -> None:
        self.module, self.file, self.line, self.error = module, file, line, error
        where = f" ({file}, line {line})" if file and line else f" ({file})" if file else ""
        detail = error.msg if isinstance(error, SyntaxError) else str(error)
        super().__init__(
            f"pipeline module {module!r} failed to import{where}: {type(error).__name__}: {detail}"
        )


@dataclass(frozen=True)
class EventProblem:
    """One problem with one event: where it is (line or index), which field, what is wrong."""

    location: str
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.location}, field {self.field!r}: {self.message}"


class EventValidationError(SharedLogicError, ValueError):
    """Events that do not match the pipeline's schema. Nothing of the batch was written."""

    def __init__(self, problems: Sequence[EventProblem], source: str = "events") -> None:
        self.problems = tuple(problems)
        self.source = source
        shown = "\n  ".join(str(p) for p in self.problems[:20])
        more = f"\n  ... and {len(self.problems) - 20} more" if len(self.problems) > 20 else ""
        super().__init__(f"{len(self.problems)} problem(s) in {source}; nothing was written:\n  {shown}{more}")
