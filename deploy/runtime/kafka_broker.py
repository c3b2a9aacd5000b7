"""The embedded Kafka broker: Apache Kafka's own broker (KRaft, one node) from Maven Central, under the data dir.

For trying the Kafka path on a fresh machine and for tests; a production cluster is run by its
operators. Nothing is installed by hand: the broker's jars are resolved once into a shared cache
(``deploy.runtime.kafka_jars``) and run on the Java that Spark uses.

Guarantees:

- ``KafkaBroker.start`` formats the storage under its folder once (idempotent: a formatted folder
  keeps its data and cluster id), listens on 127.0.0.1 only, and returns only when the broker
  answers Kafka requests; otherwise it raises ``KafkaBrokerError`` naming the broker's log file,
  and no broker process is left behind.
- ``KafkaBroker.stop`` ends the process: SIGTERM (Kafka's clean shutdown), then SIGKILL after a
  timeout. The context manager stops it however the block ends.

Run one in the foreground: ``python -m deploy.runtime.kafka_broker --dir data/kafka``.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from deploy.data_dir import private_dir
from deploy.errors import KafkaBrokerError
from deploy.runtime.kafka_config import HOST, LOG4J2, new_cluster_id, server_properties
from deploy.runtime.kafka_jars import DEFAULT_CACHE, KAFKA_VERSION, MAVEN_CENTRAL, java_binary, kafka_jars
from deploy.runtime.signals import Terminated, signals_held, stop_on_signals, unwind_on_signals

log = logging.getLogger(__name__)

#: A bounded JVM for a 2-core machine: a small heap, the serial collector, the C1 compiler only (faster start).
JVM_OPTIONS = ("-Xmx256m", "-Xms32m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-XX:+ExitOnOutOfMemoryError",
               "-Djava.awt.headless=true")
DEFAULT_PORT = 9092
_PID_FILE = "broker.pid"
_LOG_FILE = "broker.log"


# --- the broker ---------------------------------------------------------------------------------------------------


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _port_free(port: int) -> bool:
    """Whether nothing listens on ``port`` (connections of a stopped broker in TIME_WAIT do not count, as
    Kafka binds with SO_REUSEADDR too)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


@dataclass
class KafkaBroker:
    """One Kafka broker (KRaft, broker and controller in one JVM) whose files live in ``folder``.

    ``folder`` holds ``server.properties``, ``data/`` (the formatted log dir), ``broker.log`` (the
    JVM's output; the previous start's is ``broker.log.1``) and ``broker.pid`` while it runs.
    ``port`` is the PLAINTEXT listener (0: a free one), ``controller_port`` the controller's (0: a free one).
    """

    folder: Path
    port: int = 0
    controller_port: int = 0
    cache_dir: Path = DEFAULT_CACHE
    version: str = KAFKA_VERSION
    repository: str = MAVEN_CENTRAL
    jvm_options: Sequence[str] = JVM_OPTIONS
    process: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.folder = Path(self.folder).resolve()

    @property
    def bootstrap(self) -> str:
        """The address clients bootstrap from: ``127.0.0.1:PORT``."""
        return f"{HOST}:{self.port}"

    @property
    def log_file(self) -> Path:
        return self.folder / _LOG_FILE

    def classpath(self) -> str:
        return str(kafka_jars(self.cache_dir, version=self.version, repository=self.repository) / "*")

    def start(self, wait_seconds: float = 120.0) -> KafkaBroker:
        """Resolve the jars (once), format the storage (once), start the broker and wait until it answers.

        Raises ``KafkaBrokerError`` if a broker already runs on ``folder``, a port is taken, or the
        broker does not answer within ``wait_seconds`` (then its process is ended; see ``log_file``).
        """
        if self.process is not None and self.process.poll() is None:
            return self
        running = running_pid(self.folder)
        if running is not None:
            raise KafkaBrokerError(f"a Kafka broker already runs on {self.folder} (pid {running}): use it, or stop it "
                                   f"(kill {running}) before starting another on the same folder")
        self.port = self.port or free_port()
        self.controller_port = self.controller_port or free_port()
        for name, port in (("port", self.port), ("controller port", self.controller_port)):
            if not _port_free(port):
                raise KafkaBrokerError(f"the Kafka broker's {name} {port} on {HOST} is in use (another broker?): "
                                       "stop what uses it or pick another port (--port / --controller-port)")
        classpath = self.classpath()
        private_dir(self.folder)  # 0700, like the embedded Redis's: the data is the owner's alone
        config = self.folder / "server.properties"
        config.write_text(server_properties(self.folder, self.port, self.controller_port))
        (self.folder / "log4j2.properties").write_text(LOG4J2)
        self._format(classpath, config)
        if self.log_file.exists():
            os.replace(self.log_file, self.log_file.with_name(_LOG_FILE + ".1"))
        argv = [java_binary(), *self.jvm_options, f"-Dlog4j2.configurationFile={self.folder / 'log4j2.properties'}",
                "-cp", classpath, "kafka.Kafka", str(config)]
        started = time.monotonic()
        with self.log_file.open("wb") as out:
            # Its own session: a Ctrl-C in the terminal reaches this process, which stops the broker cleanly.
            self.process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            cwd=self.folder, start_new_session=True)
        (self.folder / _PID_FILE).write_text(f"{self.process.pid}\n")
        try:
            self._wait_ready(wait_seconds)
        except BaseException:
            self.stop()
            raise
        log.info("Kafka broker %s listening on %s (controller on %s:%d, pid %d) after %.1f s; data in %s, log %s",
                 self.version, self.bootstrap, HOST, self.controller_port, self.process.pid,
                 time.monotonic() - started, self.folder / "data", self.log_file)
        return self

    def _format(self, classpath: str, config: Path) -> None:
        """Format the log dir with a new cluster id unless it is formatted already (its ``meta.properties``)."""
        if (self.folder / "data" / "meta.properties").exists():
            return
        cluster_id = new_cluster_id()
        argv = [java_binary(), "-Xmx128m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp", classpath,
                "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(config), "--ignore-formatted"]
        started = time.monotonic()
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise KafkaBrokerError(f"formatting the Kafka storage in {self.folder / 'data'} failed (exit "
                                   f"{done.returncode}): {(done.stdout + done.stderr).strip()[-1500:]}; remove that "
                                   "folder to start afresh")
        log.info("formatted the Kafka storage %s (cluster id %s) in %.1f s", self.folder / "data", cluster_id,
                 time.monotonic() - started)

    def _wait_ready(self, wait_seconds: float) -> None:
        assert self.process is not None
        deadline = time.monotonic() + wait_seconds
        while time.monotonic() < deadline:
            code = self.process.poll()
            if code is not None:
                raise KafkaBrokerError(f"the Kafka broker exited with code {code} while starting on {self.bootstrap}: "
                                       f"see {self.log_file}")
            if answers(self.bootstrap):
                return
            time.sleep(0.2)
        raise KafkaBrokerError(f"the Kafka broker did not answer on {self.bootstrap} within {wait_seconds:.0f} s: "
                               f"see {self.log_file}")

    def stop(self, wait_seconds: float = 30.0) -> bool:
        """End the broker: SIGTERM (a clean shutdown), then SIGKILL after ``wait_seconds``. False if it was not running."""
        with signals_held():
            process, self.process = self.process, None
            if process is None:
                return False
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(wait_seconds)
                except subprocess.TimeoutExpired:
                    log.warning("the Kafka broker (pid %d) did not stop within %.0f s of SIGTERM: killing it",
                                process.pid, wait_seconds)
                    process.kill()
                    process.wait()
            (self.folder / _PID_FILE).unlink(missing_ok=True)
            log.info("stopped the Kafka broker on %s (its data stays in %s)", self.bootstrap, self.folder / "data")
            return True

    def __enter__(self) -> KafkaBroker:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.stop()


def running_pid(folder: Path) -> int | None:
    """The pid of a broker running on ``folder`` (from its pid file, checked against the process's command line)."""
    folder = Path(folder).resolve()
    try:
        pid = int((folder / _PID_FILE).read_text().strip())
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return None
    return pid if b"kafka.Kafka" in argv and str(folder / "server.properties").encode() in argv else None


def answers(bootstrap: str, timeout: float = 1.0) -> bool:
    """Whether a Kafka broker at ``host:port`` answers a request (ApiVersions v0): it serves clients, not just
    accepts connections."""
    host, _, port = bootstrap.rpartition(":")
    client_id = b"lambda-platform"
    request = struct.pack(">hhih", 18, 0, 7, len(client_id)) + client_id
    try:
        with socket.create_connection((host, int(port)), timeout=timeout) as s:
            s.sendall(struct.pack(">i", len(request)) + request)
            head = _read(s, 8)
    except OSError:
        return False
    return head is not None and struct.unpack(">ii", head)[1] == 7


def _read(s: socket.socket, size: int) -> bytes | None:
    data = b""
    while len(data) < size:
        chunk = s.recv(size - len(data))
        if not chunk:
            return None
        data += chunk
    return data


# --- command line -------------------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m deploy.runtime.kafka_broker",
        description="Run a local one-node Kafka broker (Apache Kafka, KRaft) in the foreground until Ctrl-C. "
        "Its jars are resolved from Maven once (about a minute, 43 MB) into the cache; its data stays in DIR.",
        epilog="Clients connect to 127.0.0.1:PORT (bootstrap.servers). Needs Java 17+. Example, from the project "
        "folder: python -m deploy.runtime.kafka_broker --dir data/kafka  (the same: make kafka)",
    )
    parser.add_argument("--dir", type=Path, default=Path("data/kafka"),
                        help="the broker's folder: configuration, data and broker.log (default: data/kafka)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"client port on 127.0.0.1 (default: {DEFAULT_PORT})")
    parser.add_argument("--controller-port", type=int, default=0, help="KRaft controller port (default: a free one)")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help=f"where jars are kept (default: {DEFAULT_CACHE})")
    parser.add_argument("--version", default=KAFKA_VERSION, help=f"Apache Kafka version (default: {KAFKA_VERSION})")
    parser.add_argument("--repository", default=MAVEN_CENTRAL, help="Maven repository or mirror to resolve from "
                        f"(default: {MAVEN_CENTRAL})")
    parser.add_argument("--resolve-only", action="store_true", help="only resolve the jars into the cache, then exit")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: 0 after a clean stop, 1 on an error (its message on stderr), 2 on a bad argument."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S")
    try:
        if args.resolve_only:
            print(kafka_jars(args.cache, version=args.version, repository=args.repository))
            return 0
        unwind_on_signals()  # while starting, Ctrl-C or SIGTERM unwinds through the broker's stop
        broker = KafkaBroker(args.dir, port=args.port, controller_port=args.controller_port, cache_dir=args.cache,
                             version=args.version, repository=args.repository)
        with broker:
            stop = stop_on_signals()
            print(f"Kafka broker ready: bootstrap.servers={broker.bootstrap} (Ctrl-C stops it; log: {broker.log_file})",
                  flush=True)
            while not stop.wait(1.0):
                if broker.process is None or broker.process.poll() is not None:
                    code = None if broker.process is None else broker.process.returncode
                    raise KafkaBrokerError(f"the Kafka broker exited on its own (code {code}): see {broker.log_file}")
        return 0
    except KafkaBrokerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # Ctrl-C while starting: the broker, if it had started, is stopped already
        sys.exit(130)
    except Terminated:
        sys.exit(143)
