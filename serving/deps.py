"""FastAPI dependencies: the objects a request handler needs, built once per app in its lifespan."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from serving.store import ServingStore
from shared_logic.pipeline import Pipeline


def get_store(request: Request) -> ServingStore:
    return request.app.state.store


def get_pipeline(request: Request) -> Pipeline:
    return request.app.state.pipeline


StoreDep = Annotated[ServingStore, Depends(get_store)]
PipelineDep = Annotated[Pipeline, Depends(get_pipeline)]
