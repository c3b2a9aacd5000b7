"""HTTP ingest. STUB: filled in by the ingest work."""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter(prefix="/v1/events", tags=["ingest"])
