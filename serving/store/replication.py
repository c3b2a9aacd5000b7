"""Writes that count only once a replica holds them (Redis Cluster with replicas).

A master that dies before its replica received a write would, after the failover, lack it, while the
writer goes on as if it were done. So a write that others build on (a micro-batch's commit, a plan
opening a group, a bucket's generation flip) is sent on one connection to its master and ends with
``WAIT 1`` on that connection: Redis replicates each master's writes as one ordered stream, so a
replica that acknowledged it holds everything that master got before it. Without the acknowledgement
(timeout, or the master died, or it is no longer a master) ``ReplicationError`` fails the write, and
the slot map is asked for again, so the writer's retry goes to the new master. A master with no
replica (known to the slot map, or attached) is not waited for.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import redis
from redis.cluster import RedisCluster
from redis.exceptions import RedisClusterException

from serving.store.errors import ReplicationError

#: How long a write waits for a replica's acknowledgement.
WAIT_MILLISECONDS = 5_000


class Master(NamedTuple):
    """A master of the cluster as the slot map names it."""

    node: redis.Redis
    #: Replicas the slot map knows (the master is asked too: one may have attached since).
    known_replicas: int
    name: str


def master_of(client: RedisCluster, key: str) -> Master:
    """The master holding ``key``'s slot."""
    nodes = client.nodes_manager.slots_cache[client.keyslot(key)]
    return Master(client.get_redis_connection(nodes[0]), len(nodes) - 1, nodes[0].name)


def replicated(client: RedisCluster, master: Master, calls: list[tuple], *, doing: str, what: str,
               otherwise: str) -> list[Any]:
    """The replies of ``calls`` on ``master``, once a replica acknowledged them; any failure is a ReplicationError
    (``doing`` failed, or ``what`` unacknowledged: ``otherwise`` says what happens then)."""
    try:
        return _on_replica(master, calls, what, otherwise)
    except (redis.RedisError, OSError) as e:
        _refresh_slots(client)
        if isinstance(e, ReplicationError):
            raise
        raise ReplicationError(f"{doing} on {master.name} failed: {e}") from e


def _refresh_slots(client: RedisCluster) -> None:
    """Ask the cluster for its slot map again (a failover moved slots: the retry goes to the new masters).
    Mid-election nobody may answer yet; the client asks again by itself on its next command then."""
    try:
        client.nodes_manager.initialize()
    except (redis.RedisError, RedisClusterException, OSError):
        pass


def _on_replica(master: Master, calls: list[tuple], what: str, otherwise: str) -> list[Any]:
    """``calls`` on one master, all on one connection (WAIT covers what *its* connection wrote), then
    ROLE (still the master? replicas attached now?), then WAIT if any replica is expected."""
    connection = master.node.connection_pool.get_connection()
    try:
        return _exchange(connection, calls, master, what, otherwise)
    except BaseException:
        connection.disconnect()  # replies may be left unread on it: never hand it to the next caller
        raise
    finally:
        master.node.connection_pool.release(connection)


def _exchange(connection: Any, calls: list[tuple], master: Master, what: str, otherwise: str) -> list[Any]:
    name = master.name
    for call in calls:
        connection.send_command(*call)
    replies = [connection.read_response() for _ in calls]
    connection.send_command("ROLE")
    role = connection.read_response()
    if role[0] not in (b"master", "master"):
        raise ReplicationError(f"{name} is no longer a master (a failover): {otherwise}")
    if max(master.known_replicas, len(role[2])) == 0:
        return replies
    connection.send_command("WAIT", 1, WAIT_MILLISECONDS)
    if int(connection.read_response()) < 1:
        raise ReplicationError(f"no replica of {name} acknowledged {what} within {WAIT_MILLISECONDS} ms: {otherwise}")
    return replies
