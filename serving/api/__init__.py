"""The HTTP API (FastAPI): merged reads, ingest, batch runs, health and metrics. ``app.create_app``."""
