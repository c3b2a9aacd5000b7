"""Liveness and readiness probes."""

from __future__ import annotations

from fastapi import APIRouter

from serving.deps import StoreDep
from serving.errors import UnavailableError
from serving.models import ERROR_RESPONSES, Health

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health, summary="Liveness: the process answers")
async def healthz() -> Health:
    return Health(status="ok")


@router.get("/readyz", response_model=Health, responses=ERROR_RESPONSES, summary="Readiness: answers can be served")
async def readyz(store: StoreDep) -> Health:
    """200 when Redis answers and a batch generation is published; 503 with the reason otherwise."""
    await store.ping()
    served = await store.generation()
    if served is None:
        raise UnavailableError("no batch generation is published yet: run `lambda-platform batch run`")
    return Health(status="ready", detail=f"serving generation {served.generation}")
