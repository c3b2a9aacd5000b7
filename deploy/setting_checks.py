"""Checks of setting values (alone and together), and the wording of a bad setting's message (``deploy.settings``).

Guarantee: no message built here contains a secret. A problem inside a secret setting
(``SECRET_SETTINGS``; the API keys are the names of LAMBDA_API_KEYS' object) is placed by position,
never by its key; a URL is shown with its password masked; JSON that does not parse is described by
the fault and its position, never quoted.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlparse

from deploy.scheduling.schedule import check_schedule
from serving.store.range_top import BUDGET_PER_PANE

SCOPES = ("read", "ingest", "admin")
#: The shortest API key accepted: a key is a password, sent with every request.
MIN_API_KEY_LENGTH = 16
#: Settings holding secrets: a problem with one is reported by its variable and a position, never
#: with any part of its value.
SECRET_SETTINGS = frozenset({"api_keys", "s3_secret_access_key", "kafka_options"})
_REDIS_SCHEMES = ("redis", "rediss", "unix", "redis+cluster")


def problem(error: Mapping[str, Any]) -> str:
    """One pydantic validation error as ``LAMBDA_NAME: what is wrong`` (a check of several settings names
    them itself). A place inside a setting (a dict's key, a list's item) follows the variable's name,
    except in a secret setting: there it is left out, since the key may be the secret."""
    message = str(error["msg"]).removeprefix("Value error, ")
    field, *inside = error["loc"] or ("",)
    if not field:
        return message
    place = "" if field in SECRET_SETTINGS or not inside else " ".join(
        f"item #{part + 1}" if isinstance(part, int) else repr(part) for part in inside) + ": "
    return f"LAMBDA_{str(field).upper()}: {place}{message}"


def json_object(value: object, example: str) -> object:
    """``value`` decoded from JSON if it is text, and a dict; ValueError naming the fault (never quoting the text)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise ValueError(f"is not valid JSON ({e.msg} at character {e.pos}); expected an object, {example}") from None
    if not isinstance(value, dict):
        raise ValueError(f"must be a JSON object, {example}")
    return value


def api_keys(value: object) -> object:
    """LAMBDA_API_KEYS decoded and checked: each key at least ``MIN_API_KEY_LENGTH`` characters, its scopes a
    list of ``SCOPES``. ValueError lists every fault by the key's position (#1 is the first written)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    keys = json_object(value, '{"<key>": ["read", "ingest", "admin"]}')
    assert isinstance(keys, dict)
    scopes_named = ", ".join(map(repr, SCOPES))
    faults = []
    for number, (key, scopes) in enumerate(keys.items(), 1):
        if not isinstance(key, str) or len(key) < MIN_API_KEY_LENGTH:
            faults.append(f"key #{number} is shorter than {MIN_API_KEY_LENGTH} characters, the minimum for an API "
                          "key (make one with `python -c 'import secrets; print(secrets.token_urlsafe(24))'`)")
        if not isinstance(scopes, list):
            faults.append(f"the scopes of key #{number} must be a JSON list of {scopes_named}")
            continue
        faults += [f"scope #{index} of key #{number} is not one of {scopes_named}"
                   for index, scope in enumerate(scopes, 1) if scope not in SCOPES]
    if faults:
        raise ValueError(f"{'; '.join(faults)} (keys are numbered in the order written)")
    return keys


def shown(url: str) -> str:
    """``url`` as a message may show it: a password in it replaced by ``***``."""
    scheme, slash, rest = url.partition("//")
    userinfo, at, host = rest.partition("@")
    if not slash or not at or ":" not in userinfo:
        return url
    return f"{scheme}//{userinfo.split(':', 1)[0]}:***@{host}"


def redis_url(value: str | None) -> str | None:
    """A Redis URL of a known scheme (a cluster's node list and bucket count checked), or None."""
    if not value:
        return None
    scheme = urlparse(value).scheme
    if scheme not in _REDIS_SCHEMES:
        raise ValueError(f"must start with one of {', '.join(s + '://' for s in _REDIS_SCHEMES)}, got {shown(value)!r}")
    if scheme == "redis+cluster":  # the node list and bucket count, checked before anything connects
        from serving.store.connection import check_cluster_url
        from serving.store.errors import StoreError

        try:
            check_cluster_url(value)
        except StoreError as e:
            raise ValueError(str(e)) from e
    return value


def tables_uri(value: str | None) -> str | None:
    """A local folder, ``file://`` or ``s3://BUCKET/...`` URI, or None."""
    if not value:
        return None
    scheme = urlparse(value).scheme
    if scheme not in ("", "file", "s3", "s3a") and len(scheme) > 1:
        raise ValueError(f"must be a local folder, file:///PATH or s3://BUCKET/PREFIX, got {shown(value)!r}")
    if scheme in ("s3", "s3a") and not urlparse(value).netloc:
        raise ValueError(f"names no bucket: use s3://BUCKET/PREFIX, got {shown(value)!r}")
    return value


def http_url(value: str | None) -> str | None:
    """An ``http://`` or ``https://`` URL, or None."""
    if value and urlparse(value).scheme not in ("http", "https"):
        raise ValueError(f"must be an http:// or https:// URL, got {shown(value)!r}")
    return value or None


def spark_master(value: str) -> str:
    """A Spark master URL: local[...], spark://, yarn, k8s:// or mesos://."""
    if not value.startswith(("local", "spark://", "yarn", "k8s://", "mesos://")):
        raise ValueError(f"is not a Spark master URL (local[*], spark://host:7077, yarn, k8s://...): {shown(value)!r}")
    return value


def schedule(value: str | None) -> str | None:
    """An interval or cron schedule (``deploy.scheduling.schedule``), or None for blank."""
    check_schedule(value or None)
    return value or None


def compact_every(value: str | None) -> str | None:
    """An interval, or None for 'off' (also blank, '0', 'never')."""
    if value is None or value.strip().lower() in ("", "off", "0", "never"):
        return None
    every = check_schedule(value)
    if every is None or every.interval is None:
        raise ValueError(f"must be an interval ('10m', '1h') or 'off', got {value!r}")
    return value.strip()


def pipeline_list(value: object) -> object:
    """LAMBDA_PIPELINES as a list: text is a JSON list or comma-separated names."""
    if isinstance(value, str):
        text = value.strip()
        return json.loads(text) if text.startswith("[") else [p.strip() for p in text.split(",") if p.strip()]
    return value


def default_pipeline(pipeline: str, pipelines: list[str] | None, *, named: bool) -> str:
    """The deployment's default pipeline: LAMBDA_PIPELINE if ``named`` (it must then be one of LAMBDA_PIPELINES),
    else the first of LAMBDA_PIPELINES when that is set. ValueError when LAMBDA_PIPELINES repeats a name."""
    if pipelines is None:
        return pipeline
    if not pipelines or len(set(pipelines)) != len(pipelines):
        raise ValueError(f"LAMBDA_PIPELINES must name each pipeline once, got {pipelines}")
    if not named:
        return pipelines[0]
    if pipeline not in pipelines:
        raise ValueError(f"LAMBDA_PIPELINE {pipeline!r} is not one of LAMBDA_PIPELINES {pipelines}")
    return pipeline


def pipeline_schedules(schedules: Mapping[str, str], pipeline_names: Sequence[str]) -> None:
    """LAMBDA_BATCH_SCHEDULES: every name a pipeline of the deployment, every value a schedule."""
    for name, text in schedules.items():
        if name not in pipeline_names:
            raise ValueError(f"LAMBDA_BATCH_SCHEDULES names {name!r}, not a pipeline of this deployment "
                             f"({', '.join(pipeline_names)})")
        check_schedule(text)


def top_call_budget(budget: int, max_top_panes: int) -> None:
    """A top-N's Lua call must have room to read a page of every list and rank one key over every pane."""
    if budget < BUDGET_PER_PANE * max_top_panes:
        raise ValueError(f"LAMBDA_TOP_CALL_BUDGET={budget} is too small for LAMBDA_MAX_TOP_PANES={max_top_panes}: "
                         f"it must be at least {BUDGET_PER_PANE} x the panes ({BUDGET_PER_PANE * max_top_panes})")
