"""Prometheus metrics. STUB: filled in by the auth/metrics work."""

from __future__ import annotations

from fastapi import FastAPI


def install_metrics(app: FastAPI) -> None:
    """Add request metrics and GET /metrics to ``app``."""
