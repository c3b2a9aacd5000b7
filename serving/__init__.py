"""The serving layer: the views' store in Redis and the HTTP API that answers from it.

* ``serving.store``: the Redis key layout (``keys``, the only place names are built), the Lua
  read scripts, clients, the served generation and epoch, the batch-run registry. The batch and
  speed layers write through it; it imports neither.
* ``serving.api``: the FastAPI application: merged, atomic reads, ingest, batch runs, metrics.
"""
