"""The batch layer: the master dataset (the source of truth) and recomputes of every view from it.

* ``batch_layer.master``: the master dataset, an append-only Delta table, its two storage engines
  (delta-rs, delta-spark) and the one reader of the Delta log. Every other layer reads events here.
* ``batch_layer.recompute``: a recompute appends a barrier, reads the snapshot at the barrier's
  version with Spark, runs the shared transformation and views, writes gold Delta tables and
  publishes them to Redis as one generation (``recompute.job.run_batch``).
* ``errors`` and ``faults`` are leaves: the package's exceptions and injected fault points.
"""
