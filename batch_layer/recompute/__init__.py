"""Batch recomputes: the master snapshot at a barrier -> gold Delta tables -> one Redis generation.

``job.run_batch`` is the whole run; ``gold`` writes a view's gold table idempotently;
``publish`` loads gold rows into Redis and flips the served generation; ``lock`` keeps one run
of a data dir at a time.
"""
