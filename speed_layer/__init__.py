"""The speed layer: a Structured Streaming query over the master dataset's log that applies the
same shared transformation and views as the batch layer to each micro-batch and writes the
increments into realtime segments in Redis, exactly once (see ``job.SpeedLayer``).
"""
