"""API keys with scopes (read, ingest, admin). STUB: filled in by the auth/metrics work."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def require(scope: str) -> Callable[..., Any]:
    """A FastAPI dependency that admits requests whose key has ``scope``."""

    async def _allow() -> None:
        return None

    return _allow
