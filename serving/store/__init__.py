"""The views' store in Redis: key layout, Lua read scripts, clients (and their replies, typed),
generations, the run registry (its record, scripts and registry). A pipeline's writers and schedulers
reach it through one session each (``session.PipelineStore``).

Below the batch and speed layers (they write here) and the HTTP API (it reads here); above the
master dataset and ``shared_logic``. Nothing here imports pyspark except ``columns``, which the
writers use.
"""
