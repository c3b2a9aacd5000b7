"""FastAPI dependencies: the objects a request handler needs, built once per app in its lifespan.

They are ``async def`` although they do no I/O: FastAPI runs plain functions in its thread pool,
which cost about a third of a key read's CPU before (benchmarks/query_bench.py).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from serving.store.reader import ServingStore
from shared_logic.pipeline import Pipeline


async def get_store(request: Request) -> ServingStore:
    return request.app.state.store


async def get_pipeline(request: Request) -> Pipeline:
    return request.app.state.pipeline


StoreDep = Annotated[ServingStore, Depends(get_store)]
PipelineDep = Annotated[Pipeline, Depends(get_pipeline)]
