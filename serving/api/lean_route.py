"""``LeanRoute``: a FastAPI route that answers its usual requests without FastAPI's per-request solving.

For every request FastAPI walks the route's dependency tree and re-derives, per parameter, how to
read it (``solve_dependencies``): on a key read that cost more CPU than the read itself
(``benchmarks/query_bench.py``). A ``LeanRoute`` is declared like any route
(``@router.get(..., route_class_override=LeanRoute)`` or ``APIRouter(route_class=LeanRoute)``),
so the OpenAPI document describes it exactly as FastAPI derives it, and FastAPI's own handler stays
behind it. What is derived per request in FastAPI is derived once here, when the route is built:

* parameters: each path and query parameter is read by its alias and validated by the route's own
  field (the same pydantic type, validators, constraints and default);
* dependencies (the route's, its router's and those of every ``include_router`` on the way): each
  is awaited with the request, sub-dependencies first and each at most once per request, as
  FastAPI does;
* the answer: validated and serialized by the route's own response field with the route's
  ``response_model_*`` options, into a ``Response`` with the same status, media type and bytes.

**Guarantee: a request gets the answer FastAPI's handler gives it.** Whenever a parameter does not
validate, the request goes to FastAPI's handler, so every 422 (and its detail) is FastAPI's own;
exceptions of dependencies and of the endpoint propagate to the app's exception handlers as with
FastAPI; when the route's ``dependency_overrides_provider`` (the app, for an included route) has
``dependency_overrides``, FastAPI's handler answers every request.

Routes whose requests need more of FastAPI are refused when the route is built (``LeanRouteError``,
naming what to change): a body, header or cookie parameters, sequence or model parameters,
dependencies that take parameters other than the request (or are generators or sync functions),
a custom response class, or no response model.
"""

from __future__ import annotations

import collections.abc
import copy
import functools
import inspect
import types
import typing
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from fastapi import routing as fastapi_routing
from fastapi.datastructures import DefaultPlaceholder
from fastapi.dependencies.models import Dependant
from fastapi.exceptions import ResponseValidationError
from fastapi.routing import APIRoute
from fastapi.utils import is_body_allowed_for_status_code
from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response

Handler = Callable[[Request], Coroutine[Any, Any, Response]]

#: FastAPI (0.16x) builds the handler of a route included through ``include_router`` with the
#: effective route (the route with the dependencies of every inclusion) in this context variable;
#: ``APIRoute.get_route_handler`` reads it, and so does ``LeanRoute``. Older FastAPI copies the
#: route on inclusion instead, so the route's own dependant is the effective one.
_EFFECTIVE_ROUTE = getattr(fastapi_routing, "_effective_route_context_var", None)

_NONE: dict[str, str] = {}  # the query parameters of a request without a query string
_IMMUTABLE = (type(None), bool, int, float, str, bytes)
_COMPOUND = (collections.abc.Sequence, collections.abc.Set, collections.abc.Mapping, BaseModel)


class LeanRouteError(TypeError):
    """A route declared as ``LeanRoute`` needs what only FastAPI's handler does (the message says what)."""


@dataclass(frozen=True)
class _Param:
    """One path or query parameter: where it is read, how it is validated, what it is when absent."""

    name: str
    alias: str
    validate: Callable[..., tuple[Any, list[Any]]] | None  # None: a plain ``str``, any string is valid as is
    required: bool
    default: Any
    copy_default: bool


@dataclass(frozen=True)
class _Dependency:
    """One dependency: its sub-dependencies (awaited first), the parameter it fills, how it is called."""

    call: Callable[..., Awaitable[Any]]
    name: str | None
    request_params: tuple[str, ...]
    use_cache: bool
    dependencies: tuple[_Dependency, ...]


class LeanRoute(APIRoute):
    """An ``APIRoute`` whose handler reads parameters, awaits dependencies and serializes the answer
    with what it derived once from the route (see the module doc for the guarantee and the limits)."""

    def get_route_handler(self) -> Handler:
        full = super().get_route_handler()
        context = _EFFECTIVE_ROUTE.get() if _EFFECTIVE_ROUTE is not None else None
        route: Any = context if context is not None and context.original_route is self else self
        return _lean_handler(route, full, f"{' '.join(sorted(self.methods or ()))} {route.path}")


def _refuse(where: str, problem: str) -> LeanRouteError:
    return LeanRouteError(f"LeanRoute {where}: {problem}; declare the route as a plain APIRoute, or change it")


def _is_sequence_or_model(annotation: Any) -> bool:
    """Whether a parameter of this type is read as several values or as a model (FastAPI's own ways)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _is_sequence_or_model(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return any(_is_sequence_or_model(arg) for arg in typing.get_args(annotation))
    target = origin or annotation
    return isinstance(target, type) and not issubclass(target, (str, bytes)) and issubclass(target, _COMPOUND)


def _params(dependant: Dependant, where: str) -> tuple[tuple[_Param, ...], tuple[_Param, ...]]:
    if dependant.header_params or dependant.cookie_params or dependant.body_params:
        raise _refuse(where, "it has header, cookie or body parameters")

    def param(field: Any) -> _Param:
        info, config = field.field_info, getattr(field, "config", None) or {}
        if not isinstance(info.validation_alias, str | None) or config.get("validate_by_alias") is False \
                or config.get("validate_by_name", config.get("populate_by_name", False)):
            raise _refuse(where, f"parameter {field.name!r} may be sent under several names")
        if _is_sequence_or_model(info.annotation):
            raise _refuse(where, f"parameter {field.name!r} has a sequence or a model type")
        required = info.is_required()
        default = None if required else field.get_default()
        if not required and info.validate_default:
            raise _refuse(where, f"parameter {field.name!r} validates its default")
        plain = info.annotation is str and not info.metadata and not config
        return _Param(field.name, info.validation_alias or field.alias, None if plain else field.validate, required,
                      default, not isinstance(default, _IMMUTABLE))

    return tuple(param(f) for f in dependant.path_params), tuple(param(f) for f in dependant.query_params)


def _is_async(call: Any) -> bool:
    """Whether FastAPI awaits ``call`` (an ``async def``, or an object whose ``__call__`` is one)."""
    if inspect.isroutine(call) or isinstance(call, functools.partial):
        return inspect.iscoroutinefunction(call)
    return callable(call) and inspect.iscoroutinefunction(type(call).__call__)


def _request_params(dependant: Dependant) -> tuple[str, ...]:
    """The parameters that take the request (as ``Request`` or as ``HTTPConnection``)."""
    return tuple(n for n in (dependant.request_param_name, dependant.http_connection_param_name) if n)


def _dependency(dependant: Dependant, where: str) -> _Dependency:
    call = dependant.call
    name = getattr(call, "__name__", type(call).__name__)
    if (dependant.path_params or dependant.query_params or dependant.header_params or dependant.cookie_params
            or dependant.body_params or dependant.websocket_param_name or dependant.response_param_name
            or dependant.background_tasks_param_name or dependant.security_scopes_param_name):
        raise _refuse(where, f"dependency {name} takes parameters other than the request")
    if call is None or not _is_async(call):
        raise _refuse(where, f"dependency {name} is not an async function (FastAPI runs it in its thread pool)")
    subs = tuple(_dependency(d, where) for d in dependant.dependencies)
    return _Dependency(call, dependant.name, _request_params(dependant), dependant.use_cache, subs)


async def _solve(dependencies: tuple[_Dependency, ...], request: Request, solved: dict[Any, Any],
                 values: dict[str, Any]) -> None:
    """Await ``dependencies`` into ``values`` in order, each after its own sub-dependencies; a call
    already made in this request is reused unless it says ``use_cache=False`` (FastAPI's rule)."""
    for dependency in dependencies:
        if dependency.use_cache and dependency.call in solved:
            value = solved[dependency.call]
        else:
            arguments: dict[str, Any] = {}
            if dependency.dependencies:
                await _solve(dependency.dependencies, request, solved, arguments)
            for name in dependency.request_params:
                arguments[name] = request
            value = solved[dependency.call] = await dependency.call(**arguments)
        if dependency.name is not None:
            values[dependency.name] = value


def _read(params: tuple[_Param, ...], received: Any, loc: str, values: dict[str, Any]) -> bool:
    """Validate ``params`` from ``received`` into ``values``; False as soon as one does not validate."""
    for p in params:
        raw = received.get(p.alias)
        if raw is None:
            if p.required:
                return False
            values[p.name] = copy.deepcopy(p.default) if p.copy_default else p.default
            continue
        if p.validate is None and type(raw) is str:
            values[p.name] = raw
            continue
        if p.validate is None:  # not a string: only FastAPI's handler knows what to say
            return False
        value, errors = p.validate(raw, values, loc=(loc, p.alias))
        if errors:
            return False
        values[p.name] = value
    return True


def _lean_handler(route: Any, full: Handler, where: str) -> Handler:
    """The lean handler of ``route`` (the effective route: every inclusion's dependencies), falling
    back to FastAPI's ``full`` handler as the module doc says."""
    dependant: Dependant = route.dependant
    endpoint = dependant.call
    if endpoint is None or not _is_async(endpoint):
        raise _refuse(where, "its endpoint is not an async function")
    if route.response_field is None or not isinstance(route.response_class, DefaultPlaceholder):
        raise _refuse(where, "it has no response model, or a custom response class")
    if route.status_code is not None and not is_body_allowed_for_status_code(route.status_code):
        raise _refuse(where, f"its status {route.status_code} has no body")
    if dependant.response_param_name or dependant.background_tasks_param_name \
            or dependant.security_scopes_param_name or dependant.websocket_param_name:
        raise _refuse(where, "its endpoint takes the response, background tasks, security scopes or a connection")
    path_params, query_params = _params(dependant, where)
    dependencies = tuple(_dependency(d, where) for d in dependant.dependencies)
    response_field = route.response_field
    options = {
        "include": route.response_model_include, "exclude": route.response_model_exclude,
        "by_alias": route.response_model_by_alias, "exclude_unset": route.response_model_exclude_unset,
        "exclude_defaults": route.response_model_exclude_defaults, "exclude_none": route.response_model_exclude_none,
    }
    status = {"status_code": route.status_code} if route.status_code else {}
    overrides = route.dependency_overrides_provider
    request_params = _request_params(dependant)

    async def handler(request: Request) -> Response:
        values: dict[str, Any] = {}
        if (overrides is not None and getattr(overrides, "dependency_overrides", None)) \
                or not _read(path_params, request.path_params, "path", values) \
                or not _read(query_params, request.query_params if request.scope.get("query_string") else _NONE,
                             "query", values):
            return await full(request)
        await _solve(dependencies, request, {}, values)
        for name in request_params:
            values[name] = request
        raw = await endpoint(**values)
        if isinstance(raw, Response):
            return raw
        answer, errors = response_field.validate(raw, {}, loc=("response",))
        if errors:
            raise ResponseValidationError(errors=errors, body=raw)
        return Response(response_field.serialize_json(answer, **options), media_type="application/json", **status)

    return handler
