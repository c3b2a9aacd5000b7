"""Batch runs over HTTP. STUB: filled in by the scheduler work."""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter(prefix="/v1/batch", tags=["batch"])
