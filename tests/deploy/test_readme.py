"""The README's commands, every one accounted for: run as written, or checked as far as it can be without a JVM.

Every ```bash block of README.md is split into commands (continuation lines joined, comment lines
dropped) and each command must match exactly one rule of ``RULES``, which names the test of this
module that runs or checks it and says how; a command no rule covers fails
``test_every_readme_command_is_covered_by_one_rule``, so a new README command needs a rule.

Checked for every block, no JVM: it is valid bash (``bash -n``); every ``lambda-platform`` command
parses with the CLI's own parser; every ``$VARIABLE`` is set earlier in its block; every
``LAMBDA_*`` variable is a setting and the block's values validate together; every ``curl`` that
sends a body says its content type (JSON inline, NDJSON from a ``.jsonl`` file) and, to ``/events``,
a key; every route names a view of the pipeline it addresses (the section's default for ``/v1/...``,
else ``/v1/pipelines/<name>/...``), and every key is one of that view's keys in the pipeline's sample
events or in events the section itself writes; an answer the README shows names that view and key and
its measures, with the values of an independent computation when the section's own events are all
the key has.

Run for real:

* One platform for the module (slow tier), in the order a reader follows: the first block of "Bring
  your own pipeline" from a checkout (a folder whose ``.venv`` is this test run's virtualenv, HOME a
  temporary folder) up to its ``up``, then the first block of "Several pipelines in one deployment",
  whose ``up`` serves ``clicks`` as the default pipeline with ``payments`` beside it: one ``up`` for
  both sections (the one ``up --no-generate`` of Bring your own pipeline is that same command on one
  pipeline; it runs in tests/chaos/test_chaos.py). Then the second block of each section, command by
  command, from ``~/clicks`` in a new shell each (a shell's own ``export``/assignments carried to its
  later commands). Oracle: the master datasets read with ``deltalake`` at the version each answer names,
  summed in plain Python. The only changes: the port (``localhost:8000`` -> a free port, also
  LAMBDA_HTTP_PORT), ``local[2]`` with 2 shuffle partitions, a 0.5 s speed trigger, a yearly
  LAMBDA_BATCH_SCHEDULE (clicks') and a demo event every 2 s (settings the README leaves to the
  reader's environment), so the 2-core suite stays light.
* ``lambda-platform ingest history/2025/ extra.csv`` (Bulk backfill) against files of its own, delta-rs,
  no JVM; the Redis Cluster block's ``python -m deploy.runtime.redis_cluster``; the "Changing the event model"
  class against a master dataset of the README's ``Click`` (delta-rs).

Checked, not run: ``make run``/``make test`` (``make -n``: what they run), object storage (tests/object_store
runs it on an S3 server), the packed environment (needs the network and builds a 1 GB environment),
Docker and compose (no engine here; tests/deploy/test_manifests.py parses the compose file).
"""

from __future__ import annotations

import argparse
import ast
import atexit
import contextlib
import importlib.util
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import urlsplit

import httpx
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import redis
import yaml
from deltalake import DeltaTable
from pydantic import ValidationError

from batch_layer.master.dataset import MasterDataset
from batch_layer.master.engines import get_engine
from deploy.cli.parser import build_parser as _parser
from deploy.demo.samples import sample_events
from deploy.runtime.redis_server import stop_embedded_redis
from deploy.settings import Settings
from shared_logic import Pipeline, load_pipeline
from shared_logic.registry import BUILTIN_PIPELINES
from tests.support import free_port, web
from tests.support.readme import Block, Command, bash_blocks, commands, readme_blocks

ROOT = Path(__file__).resolve().parents[2]
#: Variables a reader's shell has before any README command.
SHELL_VARIABLES = {"HOME", "PATH", "PWD", "USER"}


# --- the README, parsed (tests/support/readme.py) --------------------------------------------
def all_commands() -> list[Command]:
    return [c for b in bash_blocks() for c in commands(b)]


def segments(command: Command) -> list[list[str]]:
    """The simple commands of a command line (split at ``&&``, ``||``, ``;``, ``|``), as words."""
    lexer = shlex.shlex(command.text, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split, lexer.commenters = True, "#"
    parts: list[list[str]] = [[]]
    for word in lexer:
        if word in {"&&", "||", ";", "|"}:
            parts.append([])
        else:
            parts[-1].append(word)
    return [p for p in parts if p]


def program(words: list[str]) -> tuple[dict[str, str], list[str]]:
    """A simple command's leading ``NAME=value`` assignments (and ``export``'s) and the rest."""
    assigned, rest = {}, list(words)
    if rest and rest[0] == "export":
        rest = rest[1:]
    while rest and re.fullmatch(r"[A-Za-z_]\w*=.*", rest[0], re.S):
        name, _, value = rest.pop(0).partition("=")
        assigned[name] = value
    return assigned, rest


# --- how each command is covered ---------------------------------------------------------------
@dataclass(frozen=True)
class Rule:
    """Commands of ``section`` whose words fully match ``pattern`` are covered by test ``by``: ``how``."""

    section: str
    pattern: str
    by: str
    how: str


BYOP, SEVERAL = "Bring your own pipeline", "Several pipelines in one deployment"
SHARED = "run on the module's one platform"
RULES = (
    Rule("Two commands", r"make run", "test_make_targets",
         "checked: `make -n run` runs .venv/bin/lambda-platform up (run in test_the_tutorial_as_written and "
         "tests/chaos/test_chaos.py)"),
    Rule("Two commands", r"make test", "test_make_targets", "checked: `make -n test` runs pytest (this suite)"),
    Rule("Two commands", r"curl -s localhost:8000/v1/views/word_counts/keys/the", "test_curl_commands",
         "checked: route, view, key in the wordcount sample, the answer shown; the query runs in tests/chaos/test_chaos.py"),
    Rule(BYOP, r"source \.venv/bin/activate", "test_the_tutorial_as_written", SHARED),
    Rule(BYOP, r"mkdir -p ~/clicks && cd ~/clicks", "test_the_tutorial_as_written", SHARED),
    Rule(BYOP, r"export LAMBDA_PIPELINE=clicks", "test_the_tutorial_as_written", SHARED),
    Rule(BYOP, r"printf %s\\n .* > clicks\.jsonl", "test_the_tutorial_as_written", SHARED),
    Rule(BYOP, r"lambda-platform ingest clicks\.jsonl", "test_the_tutorial_as_written", SHARED),
    Rule(BYOP, r"lambda-platform batch run", "test_the_tutorial_as_written", SHARED),
    Rule(BYOP, r"lambda-platform up --no-generate", "test_every_lambda_platform_command_parses",
         "checked: parses; the module's one `up` is Several pipelines' (clicks the default); "
         "`up --no-generate` on one pipeline runs in tests/chaos/test_chaos.py"),
    Rule(BYOP, r"curl -s localhost:8000/v1/views/page_views/keys/news", "test_the_tutorial_as_written",
         SHARED),
    Rule(BYOP, r"curl -s -H Authorization: Bearer \$\(cat data/local_api_key\) -H Content-Type: application/json "
               r"-d .* localhost:8000/v1/events", "test_the_tutorial_as_written", SHARED),
    Rule(SEVERAL, r"cd ~/clicks", "test_the_tutorial_as_written", SHARED),
    Rule(SEVERAL, r"export LAMBDA_PIPELINES=.*", "test_the_tutorial_as_written", SHARED),
    Rule(SEVERAL, r"export LAMBDA_BATCH_SCHEDULES=.*", "test_the_tutorial_as_written", SHARED),
    Rule(SEVERAL, r"lambda-platform up", "test_the_tutorial_as_written", SHARED + " (it is that `up`)"),
    Rule(SEVERAL, r"KEY=\$\(cat data/local_api_key\)", "test_the_tutorial_as_written", SHARED),
    Rule(SEVERAL, r"curl -s localhost:8000/v1/pipelines", "test_the_tutorial_as_written", SHARED),
    Rule(SEVERAL, r"curl -s localhost:8000/v1/pipelines/payments/views/spend_by_user/keys/[\w-]+",
         "test_the_tutorial_as_written", SHARED),
    Rule(SEVERAL, r"printf %s\\n .* > payments\.jsonl", "test_the_tutorial_as_written", SHARED),
    Rule(SEVERAL, r"curl -s -H Authorization: Bearer \$KEY -H Content-Type: application/x-ndjson "
                  r"--data-binary @payments\.jsonl localhost:8000/v1/pipelines/payments/events",
         "test_the_tutorial_as_written", SHARED),
    Rule(SEVERAL, r"lambda-platform --pipeline payments top spend_by_user", "test_the_tutorial_as_written",
         SHARED),
    Rule(SEVERAL, r"lambda-platform status", "test_the_tutorial_as_written", SHARED),
    Rule("Bulk backfill", r"lambda-platform ingest history/2025/ extra\.csv", "test_bulk_backfill_as_written",
         "run: on files of its own (delta-rs, no JVM)"),
    Rule("Object storage", r"export LAMBDA_(TABLES_URI|S3_REGION|S3_ACCESS_KEY_ID|S3_SECRET_ACCESS_KEY)=.*",
         "test_every_lambda_setting_validates", "checked: a setting, its value validates"),
    Rule("Object storage", r"lambda-platform ingest events\.jsonl && lambda-platform batch run && "
                           r"lambda-platform up --no-generate", "test_object_storage_block",
         "checked: parses; ingest and batch run on an S3 server run in tests/object_store/test_platform_on_s3.py"),
    Rule("Scaling the view store: Redis Cluster", r"export LAMBDA_REDIS_URL=.*", "test_every_lambda_setting_validates",
         "checked: a setting, its value validates"),
    Rule("Scaling the view store: Redis Cluster",
         r"\.venv/bin/python -m deploy\.runtime\.redis_cluster --masters 3 --replicas 1 --dir data/redis-cluster",
         "test_redis_cluster_as_written", "run: a 3-master cluster, CLUSTER INFO read, stopped with SIGINT"),
    Rule("Code on the executors", r"python3\.11 -m venv lambda-env && lambda-env/bin/pip install \. venv-pack",
         "test_packed_environment_block", "checked: `.` is the installable project; not run (network, 1 GB)"),
    Rule("Code on the executors", r"lambda-env/bin/venv-pack -p lambda-env -o lambda-env\.tar\.gz",
         "test_packed_environment_block", "checked: the archive is the one unpacked and shipped; not run"),
    Rule("Code on the executors", r"mkdir environment && tar -xzf lambda-env\.tar\.gz -C environment",
         "test_packed_environment_block", "checked: the folder is the one the settings name; not run"),
    Rule("Code on the executors", r"export LAMBDA_SPARK_(ARCHIVES|EXECUTOR_PYTHON)=.*", "test_packed_environment_block",
         "checked: settings validate and name the archive and its Python"),
    Rule("Events from Kafka", r"export LAMBDA_KAFKA_BOOTSTRAP_SERVERS=embedded LAMBDA_KAFKA_TOPICS=words",
         "test_kafka_block", "checked: the settings validate; tests/chaos/test_chaos.py starts its `up` "
                             "with them (read from this line)"),
    Rule("Events from Kafka", r"\.venv/bin/lambda-platform up", "test_kafka_block",
         "checked: parses; that `up` (with --no-generate) is tests/chaos/test_chaos.py's"),
    Rule("Events from Kafka", r"\.venv/bin/lambda-platform (kafka feed --demo 1000|kafka feed events\.jsonl|status)",
         "test_kafka_block", "run as written by tests/chaos/test_chaos.py against its `up`, the embedded "
                             "broker's ingest checked against an oracle"),
    Rule("Compose and Kubernetes", r"docker build -f deploy/Dockerfile -t lambda-platform:[\w.]+ \.",
         "test_compose_block", "checked: the Dockerfile exists, the tag is the project's version and compose's image"),
    Rule("Compose and Kubernetes", r"LAMBDA_API_KEYS=.* docker compose -f deploy/compose\.yaml --profile spark up -d",
         "test_compose_block", "checked: the file and profile exist, the setting validates; "
                               "tests/deploy/test_manifests.py checks the services"),
)


def test_every_readme_command_is_covered_by_one_rule() -> None:
    uncovered, ambiguous, used = [], [], set()
    for command in all_commands():
        hits = [r for r in RULES if r.section == command.block.section and re.fullmatch(r.pattern, command.words)]
        used.update(hits)
        if not hits:
            uncovered.append(f"[{command.block.section}] {command.text}")
        elif len(hits) > 1:
            ambiguous.append(f"[{command.block.section}] {command.text}")
    assert not uncovered, ("README commands no rule of tests/deploy/test_readme.py covers: run them there or say "
                           "how they are checked (RULES):\n  " + "\n  ".join(uncovered))
    assert not ambiguous, ambiguous
    assert not [r for r in RULES if r not in used], "rules matching no README command (stale)"
    assert all(callable(globals().get(r.by)) for r in RULES), [r.by for r in RULES if r.by not in globals()]


# --- checks of every block (fast, no JVM) -------------------------------------------------------
def test_every_bash_block_is_valid_bash() -> None:
    for block in bash_blocks():
        done = subprocess.run(["bash", "-n"], input=block.text, capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, (block.section, done.stderr)


def test_every_lambda_platform_command_parses(capsys: pytest.CaptureFixture[str]) -> None:
    parsed = 0
    for command in all_commands():
        for words in segments(command):
            _, rest = program(words)
            if rest and Path(rest[0]).name == "lambda-platform":
                try:
                    args = _parser().parse_args(rest[1:])
                except SystemExit as e:
                    raise AssertionError(f"`{command.text}` does not parse: {capsys.readouterr().err}") from e
                assert args.handler is not None
                parsed += 1
    assert parsed >= 9


def _used_variables(text: str) -> list[str]:
    """``$NAME`` and ``${NAME}`` the shell expands: outside single quotes, before a trailing comment."""
    used: list[str] = []
    quote = ""
    for i, char in enumerate(text):
        if quote:
            quote = "" if char == quote else quote
            if quote == "'":
                continue
        elif char in "'\"":
            quote = char
            continue
        elif char == "#" and (i == 0 or text[i - 1].isspace()):
            break
        if char == "$":
            name = re.match(r"\{?([A-Za-z_]\w*)", text[i + 1:])
            if name:
                used.append(name.group(1))
    return used


def test_every_variable_is_set_before_use() -> None:
    for block in bash_blocks():
        defined = set(SHELL_VARIABLES)
        for command in commands(block):
            assigned_here = {}
            for words in segments(command):
                assigned_here.update(program(words)[0])
            kept = re.fullmatch(r"(export )?([A-Za-z_]\w*)=(\$\([^)]*\)|\S+)\s*(#.*)?", command.text)
            if kept:  # NAME=value alone, or exported: the shell keeps it for the commands after it
                defined.add(kept.group(2))
            missing = [n for n in _used_variables(command.text) if n not in defined | set(assigned_here)]
            assert not missing, f"[{block.section}] `{command.text}` uses {missing}, never set before it"


@contextlib.contextmanager
def _only_lambda_env(values: dict[str, str]) -> Iterator[None]:
    saved = {k: v for k, v in os.environ.items() if k.startswith("LAMBDA_")}
    for name in saved:
        del os.environ[name]
    os.environ.update(values)
    try:
        yield
    finally:
        for name in values:
            os.environ.pop(name, None)
        os.environ.update(saved)


def _settings_of(values: dict[str, str], where: str) -> Settings:
    fields = set(Settings.model_fields)
    unknown = [n for n in values if n[len("LAMBDA_"):].lower() not in fields]
    assert not unknown, f"{where}: not settings: {unknown}"
    with _only_lambda_env(values):
        try:
            return Settings(_env_file=None)  # type: ignore[call-arg]
        except ValidationError as e:
            raise AssertionError(f"{where}: invalid settings: {e}") from e


def _lambda_variables(block: Block) -> dict[str, str]:
    """Every LAMBDA_ variable a block sets, its commented-out alternatives too (`# ...: export X=...`)."""
    values: dict[str, str] = {}
    for command in commands(block):
        for words in segments(command):
            values.update({k: v for k, v in program(words)[0].items() if k.startswith("LAMBDA_")})
        for note in command.notes:
            values.update(re.findall(r"export (LAMBDA_\w+)=(\S+)", note))
    return values


def test_every_lambda_setting_validates() -> None:
    checked = 0
    for block in bash_blocks():
        values = _lambda_variables(block)
        if values:
            _settings_of(values, block.section)
            checked += len(values)
    assert checked >= 10


# --- curl: content types, keys, routes, views and keys that exist ------------------------------
#: Each view a README command asks for: the keys one event gives it (an independent reading of the
#: pipeline's transform, the oracle of "the key exists").
VIEW_KEYS: dict[tuple[str, str], Callable[[dict[str, Any]], list[str]]] = {
    ("wordcount", "word_counts"): lambda e: e["text"].split(),
    ("payments", "spend_by_user"): lambda e: [e["user_id"]],
    ("clicks", "page_views"): lambda e: [e["page"].split("/")[1]],
}


def readme_pipeline(name: str, model_block: str | None = None) -> Pipeline:
    """A built-in pipeline, or one whose module is a python block of the README (``name = "..."``)."""
    if name in BUILTIN_PIPELINES and model_block is None:
        return load_pipeline(name)
    [source] = [b.text for b in readme_blocks() if b.language == "python" and f'name = "{name}"' in b.text]
    if model_block is not None:  # the module with its event model class replaced
        source = re.sub(r"class Click\(EventModel\):.*?\n\n", model_block.rstrip() + "\n\n", source, count=1, flags=re.S)
    return _module(source, f"readme_{name}_{abs(hash(source))}").pipeline  # type: ignore[no-any-return]


_MODULES = Path(tempfile.mkdtemp(prefix="readme-modules-"))
atexit.register(shutil.rmtree, _MODULES, True)


def _module(source: str, name: str) -> ModuleType:
    """``source`` imported from a file (a pipeline's logic reads its module's source file)."""
    file = _MODULES / f"{name}.py"
    file.write_text(source)
    spec = importlib.util.spec_from_file_location(name, file)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def section_pipelines(section: str) -> list[str]:
    """The pipelines a section's commands run, the default first: what its exports say (else the default)."""
    for block in bash_blocks(section):
        values = _lambda_variables(block)
        if "LAMBDA_PIPELINES" in values:
            return [p.strip() for p in values["LAMBDA_PIPELINES"].split(",")]
        if "LAMBDA_PIPELINE" in values:
            return [values["LAMBDA_PIPELINE"]]
    return [str(Settings.model_fields["pipeline"].default)]


def written_events(section: str, before: Command | None = None) -> list[dict[str, Any]]:
    """The events a section's commands write themselves (those before ``before``): JSON objects given to
    printf or sent by curl."""
    events = []
    for block in bash_blocks(section):
        for command in commands(block):
            if command == before:
                return events
            for words in segments(command):
                if words[0] in {"printf", "curl"}:
                    for word in words[1:]:
                        with contextlib.suppress(ValueError):
                            value = json.loads(word)
                            events += [value] if isinstance(value, dict) else []
    return events


def _events_of(pipeline: Pipeline, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    fields = pipeline.event_model.model_fields
    required = {n for n, f in fields.items() if f.is_required()}
    return [e for e in events if required <= set(e) <= set(fields)]


def _measures(rows: list[dict[str, Any]], view: Any) -> dict[str, Any]:
    """A view's measures over its rows, in plain Python (the oracle of an answer shown)."""
    value: dict[str, Any] = {}
    for m in view.measures:
        column = [r[m.column] for r in rows] if m.column else []
        if m.kind == "count":
            value[m.name] = len(rows)
        else:
            value[m.name] = {"sum": sum, "min": min, "max": max, "distinct": lambda c: len(set(c))}[m.kind](column)
    return value


def _shown(notes: tuple[str, ...]) -> dict[str, Any] | None:
    """The answer a README comment shows (``# {"view":...,"value":{...},...}``): view, key, value fields."""
    for note in notes:
        found = re.search(r'\{"view":"(?P<view>[^"]+)","key":"(?P<key>[^"]+)","value":\{(?P<value>[^}]*)\}', note)
        if found:
            pairs = re.findall(r'"(\w+)":(-?[\d.]+)', found.group("value"))
            return {"view": found.group("view"), "key": found.group("key"),
                    "value": {name: float(number) for name, number in pairs}}
    return None


def _curl(words: list[str]) -> tuple[str, dict[str, str], str | None]:
    """URL, headers and body of a curl command."""
    headers, body, url, rest = {}, None, "", iter(words[1:])
    for word in rest:
        if word in {"-H", "--header"}:
            name, _, value = next(rest).partition(":")
            headers[name.strip().lower()] = value.strip()
        elif word in {"-d", "--data", "--data-binary", "--data-raw"}:
            body = next(rest)
        elif not word.startswith("-"):
            url = word
    return url, headers, body


def _check_curl(command: Command, words: list[str]) -> list[str]:
    """What is wrong with one curl command of the README (nothing: an empty list)."""
    where = f"[{command.block.section}] `{command.text}`"
    url, headers, body = _curl(words)
    path = urlsplit(url if "//" in url else f"http://{url}").path
    problems = []
    if body is not None:
        wanted = "application/x-ndjson" if body.startswith("@") and body.endswith(".jsonl") else "application/json"
        if headers.get("content-type") != wanted:
            problems.append(f"{where}: sends a body without `-H \"Content-Type: {wanted}\"` (the API answers 415)")
        if body.startswith("@") and not any(f"> {body[1:]}" in c.text for c in all_commands()
                                            if c.block.section == command.block.section):
            problems.append(f"{where}: nothing in the section writes {body[1:]}")
        if not path.endswith("/events"):
            problems.append(f"{where}: a body to {path}")
        if not headers.get("authorization", "").startswith("Bearer "):
            problems.append(f"{where}: ingest needs a key (401)")
    names = section_pipelines(command.block.section)
    if path == "/v1/pipelines":
        return problems + ([] if len(names) > 1 else [f"{where}: one pipeline"])
    route = re.fullmatch(r"/v1/pipelines/(?P<pipeline>[^/]+)(?P<rest>/.*)", path)
    pipeline_name, rest = (route.group("pipeline"), route.group("rest")) if route else (names[0], path[len("/v1"):])
    if pipeline_name not in names:
        return [*problems, f"{where}: pipeline {pipeline_name!r} is not one of the section's {names} (404)"]
    pipeline = readme_pipeline(pipeline_name)
    view_key = re.fullmatch(r"/views/(?P<view>[^/]+)/keys/(?P<key>[^/]+)", rest)
    if view_key is None:
        return problems + ([] if rest in {"/events", "/views"} else [f"{where}: a route this test does not know"])
    view_name, key = view_key.group("view"), view_key.group("key")
    [view] = [v for v in pipeline.views if v.name == view_name] or [None]
    if view is None:
        return [*problems, f"{where}: {pipeline_name} has no view {view_name!r} (404)"]
    keys_of = VIEW_KEYS[(pipeline_name, view_name)]
    sample = _events_of(pipeline, sample_events(pipeline_name) or [])
    own = _events_of(pipeline, written_events(command.block.section, before=command))
    sample_keys, own_keys = ({k for e in events for k in keys_of(e)} for events in (sample, own))
    if key not in sample_keys | own_keys:
        problems.append(f"{where}: no {key!r} in {pipeline_name}'s sample events nor in events the section writes "
                        f"before it (404); some that are: {sorted(sample_keys | own_keys)[:3]}")
    shown = _shown(command.notes)
    if shown is not None:
        measures = {m.name for m in view.measures} | {d.name for d in view.derived}
        if (shown["view"], shown["key"]) != (view_name, key) or not set(shown["value"]) <= measures:
            problems.append(f"{where}: the answer shown is not {view_name}/{key} with measures of {sorted(measures)}")
        elif key in own_keys - sample_keys:  # the section's events are all the key has: its values are known
            expected = _measures([e for e in own if key in keys_of(e)], view)
            if {n: expected[n] for n in shown["value"]} != pytest.approx(shown["value"]):
                problems.append(f"{where}: shows {shown['value']}, the events say {expected}")
    return problems


def test_curl_commands() -> None:
    curls = [(c, words) for c in all_commands() for words in segments(c) if words[0] == "curl"]
    problems = [problem for command, words in curls for problem in _check_curl(command, words)]
    assert not problems, "\n".join(problems)
    assert len(curls) >= 6


# --- sections checked on their own -------------------------------------------------------------
def test_command_line_summary_matches_the_parser() -> None:
    """The "Command line" summary lists exactly the commands the parser has."""
    [summary] = [b.text for b in readme_blocks() if b.section == "Command line" and b.language == ""]

    def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
        found = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        return dict(found[0].choices) if found else {}

    actual: set[tuple[str, ...]] = set()
    for name, child in subcommands(_parser()).items():
        actual |= {(name, action) for action in subcommands(child)} or {(name,)}
    listed: set[tuple[str, ...]] = set()
    for line in summary.splitlines():
        words = line.split()
        if words[:1] == ["lambda-platform"]:
            listed.add((words[1], words[2]) if (words[1], words[2]) in actual else (words[1],))
    assert listed == actual


def test_make_targets() -> None:
    for target, runs in (("run", ".venv/bin/lambda-platform up"), ("test", ".venv/bin/python -m pytest")):
        # as a newcomer types it: not as a sub-make of `make test` (MAKELEVEL would add "Leaving directory" lines)
        env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
        done = subprocess.run(["make", "-n", target], cwd=ROOT, capture_output=True, text=True, timeout=60, env=env)
        assert done.returncode == 0, done.stderr
        assert runs in done.stdout.splitlines()[-1], done.stdout


def test_object_storage_block() -> None:
    [block] = bash_blocks("Object storage")
    settings = _settings_of(_lambda_variables(block), "Object storage")
    assert settings.tables_on_object_store
    assert (ROOT / "tests" / "object_store" / "test_platform_on_s3.py").is_file()


def test_packed_environment_block() -> None:
    [block] = bash_blocks("Code on the executors")
    text = " ".join(c.words for c in commands(block))
    settings = _settings_of(_lambda_variables(block), "Code on the executors")
    archive, _, folder = (settings.spark_archives or "").partition("#")
    assert f"-o {archive}" in text and f"tar -xzf {archive} -C {folder}" in text, text
    assert settings.spark_executor_python == f"./{folder}/bin/python"
    assert re.search(r"^\[project\]$", (ROOT / "pyproject.toml").read_text(), re.M)  # `pip install .` installs it


def test_kafka_block() -> None:
    [block] = bash_blocks("Events from Kafka")
    settings = _settings_of(_lambda_variables(block), "Events from Kafka")
    assert settings.kafka_embedded and settings.kafka_topics_of(settings.pipeline) == (("words",), None)
    assert "Events from Kafka" in (ROOT / "tests" / "chaos" / "test_chaos.py").read_text()


def test_compose_block() -> None:
    [block] = bash_blocks("Compose and Kubernetes")
    build, up = (c.words.split() for c in commands(block))
    assert (ROOT / build[build.index("-f") + 1]).is_file()
    version = re.search(r'^version = "(.+)"$', (ROOT / "pyproject.toml").read_text(), re.M).group(1)  # type: ignore[union-attr]
    tag = build[build.index("-t") + 1]
    assert tag == f"lambda-platform:{version}", tag
    compose = yaml.safe_load((ROOT / up[up.index("-f") + 1]).read_text())["services"]
    assert {s.get("image") for s in compose.values() if "build" in s or "lambda-platform" in str(s.get("image"))} == {tag}
    profile = up[up.index("--profile") + 1]
    assert any(profile in s.get("profiles", []) for s in compose.values()), profile
    _settings_of(_lambda_variables(block), "Compose")


def test_changing_the_event_model(tmp_path: Path) -> None:
    """The section's Click, on a master dataset of the README's Click holding events: one column added, optional."""
    blocks = [b.text for b in readme_blocks() if b.section == "Changing the event model" and b.language == "python"]
    [evolved] = blocks

    def fields(source: str) -> set[str]:
        tree = ast.parse(source)
        [cls] = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "Click"]
        return {s.target.id for s in cls.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}

    before = readme_pipeline("clicks")
    added = fields(evolved) - set(before.event_model.model_fields)
    assert len(added) == 1 and fields(evolved) > set(before.event_model.model_fields)
    events = tmp_path / "clicks.jsonl"
    events.write_text('{"page": "/news/today", "ms_on_page": 1200}\n')
    old = MasterDataset(tmp_path / "master", before, get_engine("delta-rs"))
    old.ingest_file(events)
    version = DeltaTable(str(old.path)).version()

    new = MasterDataset(tmp_path / "master", readme_pipeline("clicks", evolved), get_engine("delta-rs"))
    assert set(new.check_schema().names) == added and DeltaTable(str(old.path)).version() == version  # nothing written
    new.ensure()
    table = DeltaTable(str(old.path))
    assert table.version() == version + 1  # one commit, no rows
    rows = table.to_pyarrow_table().to_pylist()
    assert [r[name] for r in rows if r["_kind"] == "event" for name in added] == [None]


# --- Bulk backfill, run ------------------------------------------------------------------------
@pytest.mark.slow  # over 2.5 s in a full run: the full tier (the quick tier has a 3-minute budget)
def test_bulk_backfill_as_written(tmp_path: Path) -> None:
    [command] = [c for b in bash_blocks("Bulk backfill") for c in commands(b)]
    folder = tmp_path / "history" / "2025"
    folder.mkdir(parents=True)
    rows = {"b.parquet": 2, "a.csv": 3, "c.jsonl": 4, "d.json": 5}  # row counts tell the files apart
    event = {"user_id": "u1", "merchant": "m", "amount": 1.5, "event_time": "2025-01-01T00:00:00Z"}
    pq.write_table(pa.table({"user_id": ["u1"] * 2, "merchant": ["m"] * 2, "amount": [1.5] * 2,
                             "event_time": pa.array([datetime(2025, 1, 1, tzinfo=timezone.utc)] * 2,
                                                    pa.timestamp("us", tz="UTC"))}), folder / "b.parquet")
    (folder / "a.csv").write_text("user_id,merchant,amount,event_time\n" + "u1,m,1.5,2025-01-01T00:00:00Z\n" * 3)
    for name in ("c.jsonl", "d.json"):
        (folder / name).write_text((json.dumps(event) + "\n") * rows[name])
    (folder / "_SUCCESS").write_text("")
    (folder / ".a.csv.crc").write_text("x")
    (folder / "notes.txt").write_text("not events")
    (tmp_path / "extra.csv").write_text("user_id,merchant,amount\n" + "u2,m,2\n" * 6)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAMBDA_")}
    env.update(LAMBDA_PIPELINE="payments", LAMBDA_STORAGE_ENGINE="delta-rs",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}")

    done = subprocess.run(["bash", "-e", "-c", command.text], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)

    assert done.returncode == 0, done.stderr
    master = tmp_path / "data" / "master" / "payments"
    latest = DeltaTable(str(master)).version()
    counts = [DeltaTable(str(master), version=v).to_pyarrow_table().num_rows for v in range(latest - 5, latest + 1)]
    per_version = [b - a for a, b in zip(counts, counts[1:])]
    # The folder's files sorted by name, one version each, then extra.csv: "every .parquet/.csv/.jsonl/.json
    # of the folder, then extra.csv".
    assert per_version == [rows["a.csv"], rows["b.parquet"], rows["c.jsonl"], rows["d.json"], 6], per_version
    assert counts[0] == 0 and "ingested 20 events from 5 files" in " ".join(done.stderr.split())


# --- Redis Cluster, run ------------------------------------------------------------------------
@pytest.mark.slow  # over 4 s: the full tier (the quick tier has a 3-minute budget)
def test_redis_cluster_as_written(tmp_path: Path) -> None:
    [command] = [c for c in commands(bash_blocks("Scaling the view store: Redis Cluster")[0]) if "redis_cluster" in c.text]
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    (checkout / ".venv").symlink_to(Path(sys.prefix))
    shell = subprocess.Popen(["bash", "-c", f"exec {command.text}"], cwd=checkout, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True)
    said = []
    try:
        assert shell.stdout is not None
        for line in shell.stdout:
            said.append(line)
            if line.startswith("export LAMBDA_REDIS_URL="):
                break
        else:
            raise AssertionError("".join(said))
        url = shlex.split(said[-1])[1].partition("=")[2]
        _settings_of({"LAMBDA_REDIS_URL": url}, "the URL it prints")
        nodes = urlsplit(url).netloc.split(",")
        assert len(nodes) == 6  # 3 masters, 1 replica each
        info = redis.Redis(host="127.0.0.1", port=int(nodes[0].rpartition(":")[2]),
                           decode_responses=True).execute_command("CLUSTER INFO")
        if isinstance(info, str):
            info = dict(line.split(":", 1) for line in info.split())
        assert (info["cluster_state"], info["cluster_size"], info["cluster_known_nodes"]) == ("ok", "3", "6"), info
    finally:
        shell.send_signal(signal.SIGINT)  # Ctrl-C
        code = shell.wait(60)
    assert code == 0, "".join(said)
    with pytest.raises(redis.ConnectionError):
        redis.Redis(host="127.0.0.1", port=int(nodes[0].rpartition(":")[2]), socket_timeout=2).ping()


# --- the platform of "Bring your own pipeline" and "Several pipelines in one deployment" ----------
@dataclass
class Tutorial:
    base: str
    port: int
    folder: Path
    env: dict[str, str]
    log: Path

    def run(self, text: str, *, before: tuple[str, ...] = (), check: bool = True) -> subprocess.CompletedProcess[str]:
        """A README command in a new shell in ~/clicks (``before``: that shell's earlier exports), with
        lambda-platform on its PATH ("source .venv/bin/activate ...: the examples below assume that");
        ``check``: it must succeed."""
        script = "\n".join((*before, text)).replace("localhost:8000", f"localhost:{self.port}")
        env = {**self.env, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{self.env['PATH']}"}
        done = subprocess.run(["bash", "-e", "-c", script], cwd=self.folder, env=env, capture_output=True, text=True,
                              timeout=120)
        assert not check or done.returncode == 0, (text, done.stdout, done.stderr)
        return done

    def said(self) -> str:
        return self.log.read_text()


#: clicks' schedule (the README leaves LAMBDA_BATCH_SCHEDULE to the reader): a cron time, which unlike an
#: interval does not tick at start, so the scheduler does not recompute clicks while the tests wait on
#: the speed layer (payments' is the README's, a cron time too).
QUIET_SCHEDULE = "0 0 1 1 *"


@pytest.fixture(scope="module")
def tutorial(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tutorial]:
    """Bring your own pipeline's first block up to its `up`, then Several pipelines' first block, in one shell."""
    tmp = tmp_path_factory.mktemp("readme")
    byop, several = [commands(b) for b in bash_blocks(BYOP)][0], [commands(b) for b in bash_blocks(SEVERAL)][0]
    assert byop[-1].words == "lambda-platform up --no-generate" and several[-1].words == "lambda-platform up"
    [module] = [b.text for b in readme_blocks() if b.section == BYOP and b.language == "python"]
    port = free_port()
    home, checkout = tmp / "home", tmp / "checkout"
    folder = home / "clicks"
    folder.mkdir(parents=True)
    checkout.mkdir()
    (checkout / ".venv").symlink_to(Path(sys.prefix))
    (folder / "clicks.py").write_text(module)  # "Save it as clicks.py in a folder of yours (here ~/clicks)"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAMBDA_") and k != "VIRTUAL_ENV"}
    env.update({"HOME": str(home), "LAMBDA_HTTP_PORT": str(port), "LAMBDA_SPARK_MASTER": "local[2]",
                "LAMBDA_SPARK_SHUFFLE_PARTITIONS": "2", "LAMBDA_SPEED_TRIGGER_SECONDS": "0.5",
                "LAMBDA_BATCH_SCHEDULE": QUIET_SCHEDULE, "LAMBDA_GENERATE_RATE": "0.5",
                # the suite's class-data-sharing archive, not one in the new HOME: its JVMs start as fast as the others
                "LAMBDA_SPARK_CLASS_ARCHIVE_DIR": str(Settings.model_fields["spark_class_archive_dir"].default.expanduser())})
    log = tmp / "shell.log"
    script = "\n".join(c.text for c in (*byop[:-1], *several))
    with log.open("w") as out:
        shell = subprocess.Popen(["bash", "-e", "-c", script], cwd=checkout, env=env, stdout=out,
                                 stderr=subprocess.STDOUT, start_new_session=True)
    tutorial = Tutorial(f"http://127.0.0.1:{port}", port, folder, env, log)
    try:
        deadline = time.monotonic() + 600
        while True:
            assert shell.poll() is None, f"the README's commands stopped:\n{tutorial.said()}"
            with contextlib.suppress(httpx.TransportError, KeyError):
                listed = web.get(f"{tutorial.base}/v1/pipelines", timeout=5).json()["pipelines"]
                if listed and all(p["generation"] is not None for p in listed):
                    break
            assert time.monotonic() < deadline, tutorial.said()
            time.sleep(0.5)
        yield tutorial
    finally:
        _stop_group(shell)
        stop_embedded_redis(folder / "data" / "redis")


def _events(master: Path, version: int | None = None) -> list[dict[str, Any]]:
    table = DeltaTable(str(master), version=version).to_pyarrow_table()
    return table.filter(pc.equal(table["_kind"], "event")).to_pylist()


def clicks_oracle(master: Path) -> dict[str, tuple[int, int]]:
    sums: dict[str, tuple[int, int]] = {}
    for event in _events(master):
        section = event["page"].split("/")[1]
        count, total = sums.get(section, (0, 0))
        sums[section] = (count + 1, total + event["ms_on_page"])
    return sums


def payments_oracle(master: Path, version: int, user: str) -> dict[str, Any]:
    """spend_by_user of ``user`` over the master at ``version``, in plain Python."""
    amounts, merchants = [], set()
    for event in _events(master, version):
        if event["user_id"] == user:
            amounts.append(event["amount"])
            merchants.add(event["merchant"])
    return {"count": len(amounts), "sum_amount": sum(amounts), "min_amount": min(amounts),
            "max_amount": max(amounts), "distinct_merchant": len(merchants), "avg_amount": sum(amounts) / len(amounts)}


def on_the_platform(test: Callable[..., None]) -> Callable[..., None]:
    """Slow, and a whole `up` tree."""
    for mark in (pytest.mark.slow, pytest.mark.uses_platform):
        test = mark(test)
    return test


@on_the_platform
def test_the_tutorial_as_written(tutorial: Tutorial) -> None:
    """Bring your own pipeline, then Several pipelines, on the one `up` the README's blocks start: one test, so the
    module's platform is started once (two tests sharing it were torn down and started again when the worker ran
    another module's test between them)."""
    _bring_your_own_pipeline_as_written(tutorial)
    _several_pipelines_as_written(tutorial)


def _bring_your_own_pipeline_as_written(tutorial: Tutorial) -> None:
    said = tutorial.said()
    assert "ingested 3 events" in said and "Traceback" not in said, said
    queries = commands(bash_blocks(BYOP)[1])
    master = tutorial.folder / "data" / "master" / "clicks"
    first = clicks_oracle(master)
    shown = _shown(queries[0].notes)
    assert shown and shown["value"] == {"count": first["news"][0], "sum_ms_on_page": first["news"][1]}
    outputs = []
    for command in queries:
        done = tutorial.run(command.text)
        outputs.append(json.loads(done.stdout))
    answer, accepted = outputs
    assert answer["view"] == "page_views" and answer["key"] == "news"
    assert answer["value"] == {"count": first["news"][0], "sum_ms_on_page": first["news"][1]}
    assert accepted["accepted"] == 1, accepted

    want = clicks_oracle(master)
    assert sum(c for c, _ in want.values()) == sum(c for c, _ in first.values()) + 1

    def merged() -> dict[str, tuple[int, int]]:
        got = {}
        for section in want:
            value = web.get(f"{tutorial.base}/v1/views/page_views/keys/{section}", timeout=10).json()["value"]
            got[section] = (value["count"], value["sum_ms_on_page"])
        return got

    deadline = time.monotonic() + 300
    while merged() != want:
        assert time.monotonic() < deadline, (merged(), want)
        time.sleep(0.5)


def _several_pipelines_as_written(tutorial: Tutorial) -> None:
    said = " ".join(tutorial.said().split())
    assert "loaded 2000 sample events" in said and "Lambda platform up (pipelines clicks, payments" in said, said
    # `up` runs no Spark of its own: payments' first generation is the scheduler's (clicks' is the `batch run` above)
    assert "computing the first generation of payments now" in said, said
    names = section_pipelines(SEVERAL)
    payments = tutorial.folder / "data" / "master" / "payments"
    before: list[str] = []
    posted: list[dict[str, Any]] = []
    for command in commands(bash_blocks(SEVERAL)[1]):
        words = command.words
        done = tutorial.run(command.text, before=tuple(before), check=words != "lambda-platform status")
        if re.fullmatch(r"(export )?[A-Z_]+=.*", words):
            before.append(command.text)
        elif words.endswith("localhost:8000/v1/pipelines"):
            listed = json.loads(done.stdout)["pipelines"]
            assert [p["name"] for p in listed] == names and [p["default"] for p in listed] == [True, False]
            assert all(p["generation"] is not None for p in listed)
            assert listed[1]["views"] == [v.name for v in load_pipeline("payments").views]
        elif words.startswith("printf"):
            file = tutorial.folder / words.rpartition("> ")[2]
            posted = [json.loads(line) for line in file.read_text().splitlines()]
        elif "/events" in words:
            answer = json.loads(done.stdout)
            assert answer["accepted"] == len(posted) > 0, answer
        elif "/keys/" in words:
            user = words.rpartition("/")[2]
            answer = _settled(tutorial, command, user, payments, posted)
            shown = _shown(command.notes)
            if shown is not None:  # the README's numbers are the true ones
                assert shown["value"] == pytest.approx({n: answer["value"][n] for n in shown["value"]})
        elif " top " in f" {words} ":
            out = " ".join(done.stdout.split())
            version = int(re.search(r"exact as of master version (\d+)", out).group(1))  # type: ignore[union-attr]
            ranked = re.findall(r"│\s*(\d+)\s*│\s*([\w-]+)\s*│\s*([\d,]+)\s*│", done.stdout)
            assert ranked, done.stdout
            counts: dict[str, int] = {}
            for event in _events(payments, version):
                counts[event["user_id"]] = counts.get(event["user_id"], 0) + 1
            assert [(key, int(n.replace(",", ""))) for _, key, n in ranked] == [(k, counts[k]) for _, k, _ in ranked]
            assert sorted((int(n.replace(",", "")) for *_, n in ranked), reverse=True) == \
                sorted(counts.values(), reverse=True)[:len(ranked)]
        elif words == "lambda-platform status":
            _serving(tutorial, command, before, names)
        else:
            assert words == "cd ~/clicks", words
    # "An unknown pipeline answers 404 naming the known ones."
    unknown = web.get(f"{tutorial.base}/v1/pipelines/wordcount/views", timeout=30)
    assert unknown.status_code == 404 and all(repr(name) in unknown.json()["detail"] for name in names), unknown.text


def _serving(tutorial: Tutorial, command: Command, before: list[str], names: list[str]) -> None:
    """`status` as written: every pipeline named, exit status 0 once every part of each serves (the speed
    layer's heartbeat may lag a loaded machine: asked again until then)."""
    deadline = time.monotonic() + 120
    while True:
        done = tutorial.run(command.text, before=tuple(before), check=False)
        said = done.stdout + done.stderr
        assert all(name in said for name in names), said
        if done.returncode == 0:
            return
        assert done.returncode == 1 and time.monotonic() < deadline, said
        time.sleep(2)


def _settled(tutorial: Tutorial, command: Command, user: str, master: Path, posted: list[dict[str, Any]]) -> dict:
    """The answer of a key query run as written, once it holds every event posted for it (the speed layer
    takes a second or so), equal to the oracle over the master at the version it names."""
    expected_posted = sum(1 for e in posted if e["user_id"] == user)
    deadline = time.monotonic() + 120
    while True:
        done = tutorial.run(command.text)
        answer = json.loads(done.stdout)
        if "value" in answer:
            oracle = payments_oracle(master, answer["version"], user)
            assert answer["view"] == "spend_by_user" and answer["key"] == user
            assert answer["value"] == pytest.approx(oracle), (answer, oracle)
            if not posted or answer["value"]["count"] >= expected_posted:
                return answer
        assert time.monotonic() < deadline, done.stdout
        time.sleep(0.5)


def _stop_group(shell: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the shell and `up` (its process group), as Ctrl-C would; `up` stops its children."""
    try:
        os.killpg(shell.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    with contextlib.suppress(subprocess.TimeoutExpired):  # `up` stopping its parts (a JVM dumping its class archive)
        shell.wait(60)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        shell.poll()  # reaped once it exits: a zombie still counts in its group
        try:
            os.killpg(shell.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.5)
    os.killpg(shell.pid, signal.SIGKILL)
