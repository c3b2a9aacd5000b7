"""Errors raised by shared_logic: bad pipeline definitions, unknown names, invalid events."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


class SharedLogicError(Exception):
    """Root of every error raised by shared_logic."""


class PipelineDefinitionError(SharedLogicError):
    """A pipeline, view or measure is declared wrongly; the message says which and how to fix it."""


class UnknownNameError(SharedLogicError, LookupError):
    """A pipeline or view name that is not registered; the message lists the known ones."""

    def __init__(self, kind: str, name: str, known: Sequence[str]) -> None:
        self.kind, self.name, self.known = kind, name, tuple(known)
        super().__init__(f"unknown {kind} {name!r}; known {kind}s: {', '.join(sorted(known)) or '(none)'}")


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
