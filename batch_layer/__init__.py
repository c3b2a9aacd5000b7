"""The batch layer: the master dataset (the source of truth), and recomputes of every view from it.

A recompute appends a barrier, reads the snapshot at the barrier's version with Spark, runs the
shared transformation and views, writes gold Delta tables and publishes them to Redis as one
generation (see ``recompute.run_batch``).
"""
