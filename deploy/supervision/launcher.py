"""`lambda-platform up`: the whole platform on one machine, as supervised child processes.

Order: the embedded Redis (unless LAMBDA_REDIS_URL is set), then, on a fresh data dir, the master
dataset (with sample events for a built-in pipeline, empty for one's own), then the API, the speed
layer, the batch scheduler and the demo traffic, all at once. The first generation is the
scheduler's: while nothing is served and the master holds events it recomputes at once (and again
after a failure), so a fresh platform needs no Spark of `up`'s own, and the speed layer's JVM starts
beside that first recompute rather than after it. Until it is published (or while the master is
empty) the API answers 503 "nothing published yet". Everything a part needs comes
through its environment (LAMBDA_*, every setting as this process resolved it), so each child is
exactly the command a user could run by hand. Running `up` again on the same data dir resumes:
Delta tables, the Redis AOF and the streaming checkpoint are all under it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

from pydantic import SecretStr
from rich.console import Console

from batch_layer.master.dataset import MasterDataset, dump_jsonl
from deploy.data_dir import private_dir, with_api_keys
from deploy.demo.samples import SAMPLES, sample_events
from deploy.errors import KafkaBrokerError
from deploy.runtime.redis_server import UMASK, embedded_redis_argv, embedded_redis_url, ping, redis_user, wait_for_redis
from deploy.runtime.signals import signals_held, stop_on_signals
from deploy.scheduling.scheduler import UNSERVED_RETRY_SECONDS
from deploy.settings import Settings
from deploy.supervision.supervisor import Child, Supervisor
from serving.store.connection import redis_client
from serving.store.keys import Keys
from serving.store.session import PipelineStore
from shared_logic.registry import load_pipeline

log = logging.getLogger(__name__)

DEFAULT_SCHEDULE = "60s"
#: Children run the command line without the current folder in front of sys.path (``-P``), so a
#: folder of the user's named like one of the platform's packages cannot shadow it; the pipeline
#: search path still ends with the current folder (``shared_logic.registry``).
_CLI = [sys.executable, *(["-P"] if sys.version_info >= (3, 11) else []), "-m", "deploy.cli"]


def _env(settings: Settings, redis_url: str) -> dict[str, str]:
    """The children's environment: every setting as resolved here, as LAMBDA_* variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAMBDA_")}
    values = settings.model_dump()
    values.update(data_dir=settings.data_dir.resolve(), redis_url=redis_url,
                  batch_schedule=settings.batch_schedule or DEFAULT_SCHEDULE)
    for name, value in values.items():
        if value is None:
            continue
        value = _revealed(value)  # the children need the secrets themselves, never their masks
        env[f"LAMBDA_{name.upper()}"] = json.dumps(value) if isinstance(value, (dict, list)) else str(value)
    env.setdefault("LAMBDA_MASTER_COMPACT_EVERY", "off")  # master_compact_every None: 'off', not the default
    env["LAMBDA_ENV_FILE"] = os.devnull  # everything is in the environment already
    return env


def _revealed(value: object) -> object:
    """``value`` with every SecretStr in it (a dict's values too: LAMBDA_KAFKA_OPTIONS) as its secret."""
    if isinstance(value, SecretStr):
        return value.get_secret_value()
    if isinstance(value, dict):
        return {k: _revealed(v) for k, v in value.items()}
    return value


def command_hint() -> str:
    """How to run `lambda-platform` the way this process was started (for messages a user pastes)."""
    script = Path(sys.argv[0])
    if script.name == "lambda-platform":
        on_path = shutil.which("lambda-platform")
        return "lambda-platform" if on_path and Path(on_path).resolve() == script.resolve() else str(script.resolve())
    return f"{sys.executable} -m deploy.cli"


def run_platform(settings: Settings, *, generate_traffic: bool, console: Console) -> int:
    """Run every part, for every pipeline of ``settings``, until SIGINT/SIGTERM; returns the exit status (0: stopped).

    However it ends (stopped, a part that cannot start, Ctrl-C or SIGTERM while starting), every
    child it started is stopped, and the line saying so names exactly those.
    """
    # Before any child starts: refuse an event model a master dataset cannot follow (SchemaChangeError,
    # nothing written), or add a new optional field's column once, here, rather than in each child.
    masters = {name: MasterDataset.open(settings.for_pipeline(name), load_pipeline(name))
               for name in settings.pipeline_names}
    for master in masters.values():
        if master.check_schema():
            master.ensure()
    logs = private_dir(settings.data_dir.resolve() / "logs")
    settings, key = with_api_keys(settings)
    supervisor = Supervisor([])
    redis_url = settings.redis_url or embedded_redis_url(settings.redis_dir)
    env = _env(settings, redis_url)
    with contextlib.ExitStack() as held:
        if not settings.redis_url:  # one of the embedded Redis's users: no other command stops it under us
            held.enter_context(redis_user(settings.redis_dir))
        try:
            broker = _start(supervisor, settings, masters, redis_url, env, logs, console,
                            generate_traffic=generate_traffic)
            # From here a stop is a clean one: the API may answer already, and the banner soon says "Ctrl-C".
            stop = stop_on_signals()
            if settings.kafka_bootstrap is not None and _await_broker(settings, broker, logs, console, stop):
                _start_part(supervisor, "kafka-ingest", ["kafka", "ingest"], env, logs)
            default = masters[settings.pipeline_names[0]]
            if not stop.is_set():
                _banner(console, settings, default.pipeline.views[0].name, key, logs, redis_url,
                        empty=not default.holds_data(), unserved=_unserved(masters, redis_url))
            while not stop.is_set():
                supervisor.watch_once()
                stop.wait(0.5)
        finally:
            if supervisor.children:
                console.print(f"stopping: {stopping(supervisor.children)}")
            with signals_held():  # a second Ctrl-C cannot leave children behind
                supervisor.stop()
    return 0


def _start(supervisor: Supervisor, settings: Settings, masters: dict[str, MasterDataset], redis_url: str,
           env: dict[str, str], logs: Path, console: Console, *, generate_traffic: bool) -> Child | None:
    """Start Redis (embedded, unless running or configured), fill fresh master datasets, then the other parts but
    the Kafka ingest, which waits for the broker (``_await_broker``); returns the embedded broker it started."""
    if not settings.redis_url and not ping(redis_url):
        private_dir(settings.redis_dir)
        redis = Child("redis", embedded_redis_argv(settings.redis_dir, daemonize=False), env, logs / "redis.log",
                      stop_last=True, umask=UMASK)
        supervisor.children.append(redis)
        redis.start()
        wait_for_redis(redis_url, 15, settings.redis_dir / "redis.log")

    for master in masters.values():
        if not master.holds_data():
            _fresh_master(master, console)

    # The embedded broker's JVM starts first and the other parts beside it; only the Kafka ingest waits for it.
    broker = _launch_broker(supervisor, settings, env, logs)
    parts = [("api", ["serve"]), ("speed", ["speed", "run"]), ("scheduler", ["batch", "schedule"])]
    if generate_traffic:
        several = len(masters) > 1
        parts += [(f"generator-{master.pipeline.name}" if several else "generator", ["--pipeline", name, "generate"])
                  for name, master in masters.items() if master.pipeline.name in SAMPLES]
    for name, args in parts:
        _start_part(supervisor, name, args, env, logs)
    return broker


def _start_part(supervisor: Supervisor, name: str, args: list[str], env: dict[str, str], logs: Path) -> None:
    child = Child(name, [*_CLI, *args], env, logs / f"{name}.log")
    supervisor.children.append(child)
    child.start()


def _launch_broker(supervisor: Supervisor, settings: Settings, env: dict[str, str], logs: Path) -> Child | None:
    """LAMBDA_KAFKA_BOOTSTRAP_SERVERS=embedded: start the local broker (unless one answers already), stopped with
    Redis; it is not waited for here (``_await_broker``)."""
    from deploy.runtime.kafka_broker import answers

    bootstrap = settings.kafka_bootstrap
    if not settings.kafka_embedded or bootstrap is None or answers(bootstrap):
        return None
    broker = Child("kafka", [*_CLI, "kafka", "broker"], env, logs / "kafka.log", stop_last=True)
    supervisor.children.append(broker)
    broker.start()
    return broker


def _await_broker(settings: Settings, broker: Child | None, logs: Path, console: Console,
                  stop: threading.Event) -> bool:
    """The embedded broker answers (``broker``: the one `up` started, or None) and has the configured topics; False
    when a stop was asked meanwhile (nothing more to start). A broker configured elsewhere is not waited for."""
    from deploy.runtime.kafka_broker import answers

    bootstrap = settings.kafka_bootstrap
    if not settings.kafka_embedded or bootstrap is None:
        return True
    with console.status(f"starting the embedded Kafka broker on {bootstrap} (the first time resolves its jars)"):
        deadline = time.monotonic() + 300
        while not answers(bootstrap):
            if broker is None:  # it answered when `up` started: not ours to wait for
                raise KafkaBrokerError(f"the Kafka broker at {bootstrap} stopped answering while `up` started")
            if broker.process is None or broker.process.poll() is not None or time.monotonic() > deadline:
                raise KafkaBrokerError(f"the embedded Kafka broker did not start: see {logs / 'kafka.log'}")
            if stop.wait(0.5):
                return False
    _create_topics(bootstrap, [t for name in settings.pipeline_names for t in settings.kafka_topics_of(name)[0]])
    return not stop.is_set()


def _create_topics(bootstrap: str, topics: list[str], partitions: int = 2) -> None:
    """The embedded broker gets the configured topics (those it lacks), so `kafka feed` and the ingest find them."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    missing = sorted(set(topics) - set(admin.list_topics(timeout=30).topics))
    if missing:
        futures = admin.create_topics([NewTopic(t, num_partitions=partitions, replication_factor=1) for t in missing])
        for topic, future in futures.items():
            future.result(30)
            log.info("embedded Kafka broker: created topic %s (%d partitions)", topic, partitions)


#: How the stop line names each part (a child's name, or its prefix before ``-<pipeline>``).
_STOPPING = {"generator": "generator", "scheduler": "scheduler", "speed": "speed layer (after its micro-batch)",
             "api": "API", "redis": "Redis", "kafka": "Kafka broker", "kafka-ingest": "Kafka ingest"}


def stopping(children: list[Child]) -> str:
    """The parts ``children`` are, in the order ``Supervisor.stop`` stops them: the others, last started
    first, then the ``stop_last`` ones (Redis)."""
    order = [c for c in reversed(children) if not c.stop_last] + [c for c in reversed(children) if c.stop_last]
    names = [_STOPPING.get(c.name, _STOPPING.get(c.name.split("-")[0], c.name)) for c in order]
    several = {name for name in names if names.count(name) > 1}
    return ", ".join(dict.fromkeys(f"{name}s" if name in several else name for name in names))


def _fresh_master(master: MasterDataset, console: Console) -> None:
    """Create the master dataset; a built-in pipeline's gets its sample events."""
    events = sample_events(master.pipeline.name)
    if events is None:
        master.ensure()
        return
    with tempfile.TemporaryDirectory() as tmp:
        sample = Path(tmp) / f"{master.pipeline.name}-sample.jsonl"
        dump_jsonl(events, sample)
        result = master.ingest_file(sample)
    console.print(f"loaded {result.events} sample events into a new master dataset (version {result.version})")


def _unserved(masters: dict[str, MasterDataset], redis_url: str) -> list[str]:
    """The pipelines whose master holds events and which serve no generation yet (the scheduler's first run)."""
    client = redis_client(redis_url)
    return [master.pipeline.name for master in masters.values() if master.holds_data()
            and PipelineStore(client, Keys(master.pipeline.name)).served_generation() is None]


def _banner(console: Console, settings: Settings, view: str, key: str | None, logs: Path, redis_url: str,
            *, empty: bool, unserved: list[str]) -> None:
    base = f"http://{settings.http_host}:{settings.http_port}"
    if unserved:
        console.print(
            f"\nThe batch scheduler is computing the first generation of {', '.join(unserved)} now (Spark starts "
            f"first; see {logs / 'scheduler.log'}): until it is served, in a minute or so, the API answers 503 "
            f"(nothing published yet). A run that fails is tried again every {UNSERVED_RETRY_SECONDS:.0f} s; `status` "
            "shows its error.",
            soft_wrap=True)
    if empty:
        auth = f'-H "Authorization: Bearer {key}" ' if key else '-H "Authorization: Bearer <key>" '
        console.print(
            f"\n[yellow]The master dataset is empty[/]: the API answers 503 (nothing published yet) until events "
            f"arrive; the first generation is published seconds after the first events, e.g.\n"
            f"  curl {auth}-H 'Content-Type: application/x-ndjson' --data-binary @events.jsonl {base}/v1/events\n"
            f"  {command_hint()} --data-dir {settings.data_dir} --pipeline {settings.pipeline} ingest events.jsonl",
            soft_wrap=True,
        )
    auth = f'-H "Authorization: Bearer {key}" ' if key else ""
    console.print(
        f"\n[bold]Lambda platform up[/] ({_pipelines(settings)})\n"
        f"  console:    {base}/console\n"
        f"  API docs:   {base}/docs\n"
        f"  views:      curl {auth}{base}/v1/views\n"
        f"  a key:      curl {auth}{base}/v1/views/{view}/top\n"
        f"  metrics:    {base}/metrics\n"
        f"  API key:    {key or '(from LAMBDA_API_KEYS)'}  (scopes read, ingest, admin)\n"
        f"  data:       {settings.data_dir.resolve()}\n"
        f"  logs:       {logs}\n"
        f"  Redis:      {redis_url}\n"
        f"  status:     {command_hint()} --data-dir {settings.data_dir} --pipeline {settings.pipeline} status\n"
        f"{_kafka_line(settings)}"
        "Ctrl-C stops everything.\n",
        soft_wrap=True,
    )


def _kafka_line(settings: Settings) -> str:
    if settings.kafka_bootstrap is None:
        return ""
    topics = "; ".join(f"{name}: {spec}" for name, spec in settings.kafka_topics.items())
    return (f"  Kafka:      {topics} on {settings.kafka_bootstrap}; feed it with {command_hint()} --data-dir "
            f"{settings.data_dir} kafka feed FILE.jsonl (or --demo 1000)\n")


def _pipelines(settings: Settings) -> str:
    if len(settings.pipeline_names) == 1:
        return f"pipeline {settings.pipeline}"
    default, *others = settings.pipeline_names
    return (f"pipelines {', '.join(settings.pipeline_names)}: {default} at /v1/..., "
            + ", ".join(f"{name} at /v1/pipelines/{load_pipeline(name).name}/..." for name in others))
