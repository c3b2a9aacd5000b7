"""What a command leaves behind and what it prints on the way, as a user runs it.

* `batch run -v` shows the JVM's lines (Spark's WARN lines, the JVM's own warnings) as well as
  logging them in `DATA_DIR/logs/batch.log` (without `-v` they stay out of the terminal:
  tests/deploy/cli/test_cli.py).
* The embedded Redis a command started is stopped when it ends: Ctrl-C (SIGINT to its process
  group, as a terminal sends it), SIGTERM, or done (tests/deploy/cli/test_cli.py). While another
  command uses it, it stays up.
* `up --no-generate` names only the parts it runs when it stops.
* `serve` ends with 0 on Ctrl-C or SIGTERM, and with EXIT_CODE_CHANGED (a planned restart, not a failure) when its
  pipeline's module changes on disk: it answers with the views and logic it imported, so a supervisor starts it
  on the new code (under `up`: tests/deploy/supervision/test_up_logic_change.py).
* Ctrl-C or SIGTERM raised inside a `__del__` (Python prints such an exception and drops it) comes again.

A deprecated Spark setting (`spark.cache.class`) makes the JVM print one known WARN line at start.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import httpx
import psutil
import pytest
import redis

from deploy.runtime.redis_server import embedded_redis, embedded_redis_url, ping, stop_embedded_redis
from deploy.supervision.code_watch import EXIT_CODE_CHANGED
from deploy.supervision.launcher import stopping
from deploy.supervision.supervisor import Child
from tests.support import CLI, CLICKS_PIPELINE, JVM_LINE, NOISY_SPARK_CONF, NOISY_SPARK_WARN, free_port, wait_for, web


def _env(tmp_path: Path, **more: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LAMBDA_")}
    env.update({"LAMBDA_DATA_DIR": str(tmp_path / "data"), "LAMBDA_ENV_FILE": os.devnull,
                "LAMBDA_SPARK_MASTER": "local[1]", "LAMBDA_SPARK_SHUFFLE_PARTITIONS": "1",
                "LAMBDA_SPARK_CONF": NOISY_SPARK_CONF, **more})
    return env


def _ingest(tmp_path: Path, env: dict[str, str]) -> None:
    (tmp_path / "lines.jsonl").write_text('{"text": "to be or not to be"}\n{"text": "be quick"}\n')
    done = subprocess.run([*CLI, "ingest", str(tmp_path / "lines.jsonl")], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr


def _redis_pid(data_dir: Path) -> int:
    """The embedded Redis daemon's pid, once it answers."""
    redis_dir = data_dir.resolve() / "redis"
    wait_for(lambda: ping(embedded_redis_url(redis_dir)), "the command's embedded Redis", 300, poll=0.05)
    return int((redis_dir / "redis.pid").read_text())


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@dataclass
class _Run:
    """A command running: its process, its stderr lines as they come (``errors``), its stdout lines."""

    process: subprocess.Popen[str]
    errors: queue.Queue[str] = field(default_factory=queue.Queue)
    output: list[str] = field(default_factory=list)
    readers: list[threading.Thread] = field(default_factory=list)

    def said(self, timeout: float = 900) -> str:
        """Everything it wrote on stderr, once it has exited."""
        self.process.wait(timeout)
        for reader in self.readers:
            reader.join(30)  # the pipes end with the process (a JVM still holding one: 30 s more at most)
        return "".join(self.errors.queue)


@contextmanager
def _command(env: dict[str, str], *args: str) -> Iterator[_Run]:
    """``lambda-platform ARGS`` in its own process group. On the way out whatever of its group still runs is
    killed (the JVM and Python workers too; the Redis daemon has its own) and its embedded Redis stopped."""
    run = _Run(subprocess.Popen([*CLI, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True))
    run.readers = [threading.Thread(target=_read, args=(run.process.stderr, run.errors.put), daemon=True),
                   threading.Thread(target=_read, args=(run.process.stdout, run.output.append), daemon=True)]
    for reader in run.readers:
        reader.start()
    try:
        yield run
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.process.pid, signal.SIGKILL)
        run.process.wait(60)
        stop_embedded_redis(Path(env["LAMBDA_DATA_DIR"]) / "redis")


def _read(stream: IO[str], put: Callable[[str], object]) -> None:
    for line in stream:
        put(line)


@pytest.mark.slow
def test_ctrl_c_during_a_verbose_batch_run_stops_its_redis_and_showed_the_jvm_lines(tmp_path: Path) -> None:
    env = _env(tmp_path)
    _ingest(tmp_path, env)
    with _command(env, "--verbose", "batch", "run") as run:
        pid = _redis_pid(tmp_path / "data")
        seen: list[str] = []
        while not any(jvm in line for line in seen for jvm in JVM_LINE):  # Spark starts: -v shows its lines
            seen.append(run.errors.get(timeout=600))
        os.killpg(run.process.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        said = run.said(300)
        assert run.process.returncode == 130, said
        wait_for(lambda: _gone(pid), "the embedded Redis to stop after Ctrl-C", 60)
        assert NOISY_SPARK_WARN in (tmp_path / "data" / "logs" / "batch.log").read_text()  # -v shows it and logs it


@pytest.mark.slow
def test_sigterm_as_soon_as_its_redis_answers_stops_it(tmp_path: Path) -> None:
    env = _env(tmp_path)
    _ingest(tmp_path, env)
    with _command(env, "batch", "run") as run:
        pid = _redis_pid(tmp_path / "data")
        run.process.send_signal(signal.SIGTERM)
        said = run.said(300)
        assert run.process.returncode == 143, said
        assert "terminated" in said
        wait_for(lambda: _gone(pid), "the embedded Redis to stop after SIGTERM", 60)


@pytest.mark.slow  # three API starts, over 2.5 s: the full tier (the quick tier has a 3-minute budget)
def test_serve_ends_0_on_ctrl_c_or_sigterm_and_asks_for_a_restart_when_its_pipeline_module_changes(
        tmp_path: Path) -> None:
    """uvicorn raises a stop's signal again once it has shut down; `serve` ends 0 all the same (`up` stops its
    parts with SIGTERM, and a clean stop must read as one), and asks for a restart after an edit."""
    (tmp_path / "user_pipes").mkdir()
    (tmp_path / "user_pipes" / "__init__.py").write_text("")
    module = tmp_path / "user_pipes" / "clicks.py"
    module.write_text(CLICKS_PIPELINE)
    port = free_port()
    env = _env(tmp_path, LAMBDA_PIPELINE="user_pipes.clicks", LAMBDA_HTTP_PORT=str(port),
               PYTHONPATH=os.pathsep.join([str(tmp_path), str(Path.cwd()), os.environ.get("PYTHONPATH", "")]))

    def serving() -> bool:
        return web.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200

    for cause, code in (("ctrl-c", 0), ("sigterm", 0), ("edit", EXIT_CODE_CHANGED)):
        with _command(env, "serve") as run:
            wait_for(serving, "the API", 120, ignoring=(httpx.TransportError,))
            if cause == "ctrl-c":
                os.killpg(run.process.pid, signal.SIGINT)
            elif cause == "sigterm":
                run.process.send_signal(signal.SIGTERM)
            else:
                module.write_text(CLICKS_PIPELINE + "\n# edited\n")
            said = run.said(120)
            assert run.process.returncode == code, (cause, said)
        assert ("changed on disk" in said) == (cause == "edit"), said


@pytest.mark.slow  # over 2.5 s in a full run: the full tier (the quick tier has a 3-minute budget)
def test_a_redis_in_use_by_another_command_stays_up_and_the_last_user_stops_it(tmp_path: Path) -> None:
    """Two users on one data dir (separate lock handles behave as separate processes): the first to leave
    leaves it running; the last stops it; the next one starts it again with every write kept."""
    redis_dir = tmp_path / "data" / "redis"
    with embedded_redis(redis_dir) as first:
        pid = int((redis_dir / "redis.pid").read_text())
        with embedded_redis(redis_dir) as second:
            assert second == first
            redis.Redis.from_url(first).set("kept", "yes")
        assert ping(first), "stopped while another user still uses it"
    wait_for(lambda: _gone(pid), "the last user to stop the embedded Redis", 60)
    assert not ping(first)
    with embedded_redis(redis_dir) as again:
        assert redis.Redis.from_url(again).get("kept") == b"yes"
    assert not ping(again)


def _child(name: str, *, stop_last: bool = False) -> Child:
    return Child(name, ["true"], {}, Path(f"{name}.log"), stop_last=stop_last)


def test_the_stop_line_names_the_parts_that_run() -> None:
    redis_child = _child("redis", stop_last=True)
    assert stopping([redis_child, _child("api"), _child("speed"), _child("scheduler")]) == \
        "scheduler, speed layer (after its micro-batch), API, Redis"
    assert stopping([_child("api"), _child("speed"), _child("scheduler"), _child("generator")]) == \
        "generator, scheduler, speed layer (after its micro-batch), API"
    assert stopping([redis_child, _child("api"), _child("generator-payments"), _child("generator-clicks")]) == \
        "generators, API, Redis"


@pytest.mark.slow
def test_up_no_generate_does_not_say_it_stops_a_generator(tmp_path: Path) -> None:
    (tmp_path / "user_pipes").mkdir()
    (tmp_path / "user_pipes" / "__init__.py").write_text("")
    (tmp_path / "user_pipes" / "clicks.py").write_text(CLICKS_PIPELINE)
    env = _env(tmp_path, LAMBDA_PIPELINE="user_pipes.clicks", LAMBDA_HTTP_PORT=str(free_port()),
               LAMBDA_BATCH_SCHEDULE="1h", LAMBDA_SPARK_CONF="{}",
               PYTHONPATH=os.pathsep.join([str(tmp_path), str(Path.cwd()), os.environ.get("PYTHONPATH", "")]))
    process = subprocess.Popen([*CLI, "up", "--no-generate"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, start_new_session=True)
    assert process.stdout is not None
    family: list[psutil.Process] = []
    try:
        said = ""
        while "Ctrl-C stops everything" not in said:
            line = process.stdout.readline()
            assert line, said
            said += line
        family = psutil.Process(process.pid).children(recursive=True)
        process.send_signal(signal.SIGTERM)
        rest, _ = process.communicate(timeout=300)
        stops = [line for line in rest.splitlines() if line.startswith("stopping:")]
        assert stops == ["stopping: scheduler, speed layer (after its micro-batch), API, Redis"], rest
        assert process.returncode == 0, rest
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(60)
        for member in family:
            try:
                member.kill()
            except psutil.NoSuchProcess:
                pass


_LOST_IN_A_FINALIZER = """
import os, signal, sys, time
from deploy.runtime.signals import Terminated, unwind_on_signals

signal.signal(signal.SIGINT, signal.default_int_handler)  # as from a terminal: a shell's background job starts
unwind_on_signals()                                       # with Ctrl-C ignored, and Python keeps it ignored


class Finalizer:
    def __del__(self):
        os.kill(os.getpid(), {signal})
        for _ in range(100_000):  # the handler runs here, in __del__, where Python can only print its exception
            pass


try:
    Finalizer()
    time.sleep(60)
    print("ran on")
except (Terminated, KeyboardInterrupt) as e:
    print("unwound by", type(e).__name__)
"""


@pytest.mark.parametrize(("sent", "unwound_by"), [("signal.SIGTERM", "Terminated"), ("signal.SIGINT", "KeyboardInterrupt")])
def test_an_interrupt_raised_inside_a_finalizer_is_raised_again(sent: str, unwound_by: str) -> None:
    """Python prints an exception raised in a __del__ and drops it: the interrupt comes again, and unwinds."""
    done = subprocess.run([sys.executable, "-c", _LOST_IN_A_FINALIZER.replace("{signal}", sent)], capture_output=True,
                          text=True, timeout=120, cwd=Path(__file__).resolve().parents[3])
    assert done.stdout.strip() == f"unwound by {unwound_by}", done.stdout + done.stderr
    assert "Exception ignored" not in done.stderr, done.stderr
