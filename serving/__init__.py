"""The serving layer: the Redis key layout, atomic merged reads, and the FastAPI application."""
