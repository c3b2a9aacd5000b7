"""Errors of the serving layer. ``serving.app`` maps each class to its HTTP status in one place."""

from __future__ import annotations


class ServingError(Exception):
    """Root of every error raised by serving. ``status`` is the HTTP status it answers with."""

    status = 500


class NotFoundError(ServingError):
    """The view or key does not exist (message says which, and what exists)."""

    status = 404


class BadQueryError(ServingError):
    """The query's parameters do not fit the view (message says what to send instead)."""

    status = 422


class UnavailableError(ServingError):
    """The platform cannot answer correctly right now (Redis unreachable, nothing published)."""

    status = 503
