"""Errors of the serving layer. ``serving.api.app`` maps each class to its HTTP status in one place."""

from __future__ import annotations

from serving.store.errors import StoreUnavailableError


class ServingError(Exception):
    """Root of every error raised by serving. ``status`` is the HTTP status it answers with;
    ``headers`` go with the answer (e.g. ``Location`` of the run a 409 is about)."""

    status = 500

    def __init__(self, message: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.headers = headers


class NotFoundError(ServingError):
    """The view or key does not exist (message says which, and what exists)."""

    status = 404


class BadQueryError(ServingError):
    """The query's parameters do not fit the view (message says what to send instead)."""

    status = 422


class UnavailableError(ServingError):
    """The platform cannot answer correctly right now (Redis unreachable, nothing published)."""

    status = 503

    @classmethod
    def from_store(cls, error: StoreUnavailableError) -> UnavailableError:
        """The store's refusal, with its reason (and ``Retry-After`` when it gave one)."""
        retry = None if error.retry_after is None else {"Retry-After": str(error.retry_after)}
        return cls(str(error), headers=retry)


class ConflictError(ServingError):
    """The request conflicts with what is in progress (a batch run is already queued or running)."""

    status = 409


class BadRequestError(ServingError):
    """The request cannot be read: malformed JSON, a malformed header (the message says where)."""

    status = 400


class PayloadTooLargeError(ServingError):
    """The request body is larger than the server accepts (``LAMBDA_MAX_BODY_BYTES``)."""

    status = 413


class UnsupportedMediaTypeError(ServingError):
    """The request body's Content-Type is not one the route reads (the message lists those)."""

    status = 415


class UnprocessableError(ServingError):
    """The request is well-formed but cannot be processed as sent (the message says why)."""

    status = 422


class IdempotencyKeyReusedError(UnprocessableError):
    """An Idempotency-Key already used with a different request body: use a new key for new events."""


class ConfigurationError(ServingError):
    """The API cannot be built from its configuration (message says what to change)."""

    status = 500
