"""A local Redis Cluster, for the tests and the bench: three masters and three replicas, all the one
`redis-server` in cluster mode.

    with RedisCluster() as cluster:              # free ports (and their bus ports), files in a temp dir
        client = cluster.client()                # a redis.cluster.RedisCluster; cluster.url names it too
        master = cluster.masters()[0]            # or cluster.master_of(key); cluster.replica_of(master)
        cluster.failover(master)                 # CLUSTER FAILOVER on its replica; returns once all agree
        cluster.kill_master(master)              # SIGKILL; returns once promoted and the killed one rejoined
        cluster.command_counts()                 # {master port: commands it served}; reset_stats() zeroes
        cluster.cpu_seconds()                    # {master port: its CPU seconds so far}

The nodes are `orchestrator.redis_server.RedisServer`s (AOF on, fsynced every second) started with
`--cluster-enabled yes`, each with its own directory in the temp dir for its data and its cluster
configuration file (`nodes.conf`, which Redis rewrites; a restarted node reads it back and rejoins as the same
node). A node timeout of one second makes failing over take a second or two. `redis-cli --cluster create …
--cluster-replicas 1` makes the cluster. A cluster node also listens on its port + 10000 (the cluster bus), so
both ports are picked free, and the port under 55536.

Every call that changes who leads returns once the cluster has `settled`: every node says `cluster_state:ok`
with all 16384 slots ok and knows all six nodes, all six describe the same masters, slots and replicas
(CLUSTER NODES) with nobody flagged failing, every master has one replica, and every replica's link to its
master is up.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import NamedTuple

import redis
import redis.cluster
from redis.crc import key_slot

from orchestrator.errors import PortUnavailableError
from orchestrator.redis_server import RedisServer, find_free_port, find_redis_server

POLL_S = 0.05

HOST = "127.0.0.1"
# Generous: two cores shared with other suites; a settled cluster normally takes a few seconds.
READY_TIMEOUT_S = 60.0
# A replica gives up a manual failover it could not complete after five seconds; it is asked again after ten.
MANUAL_FAILOVER_S = 10.0
SLOTS = 16384
# Redis puts a node's cluster bus on its port + 10000: the port must leave room for it below 65536.
BUS_PORT_OFFSET = 10000
MAX_PORT = 65535 - BUS_PORT_OFFSET
# Commands that are no client's work: the fixture's own probes, redis-py's discovery of the cluster, and the
# replication traffic (a replica's REPLCONF ACK every second). `command_counts` leaves them out.
HOUSEKEEPING_COMMANDS = frozenset(
    {"info", "cluster", "config", "ping", "role", "command", "client", "hello", "replconf", "psync", "sync"}
)
# Flags in CLUSTER NODES of a node that some node cannot count on.
TROUBLE_FLAGS = frozenset({"fail", "fail?", "handshake", "noaddr"})


def find_redis_cli() -> str:
    """Path of the `redis-cli` beside the `redis-server` in use, else the one on PATH."""
    beside = Path(find_redis_server()).with_name("redis-cli")
    if beside.is_file():
        return str(beside)
    on_path = shutil.which("redis-cli")
    if on_path is None:
        raise RuntimeError("no redis-cli found beside redis-server or on PATH: it creates the cluster")
    return on_path


def find_free_cluster_port(taken: set[int]) -> int:
    """A free port under 55536 whose cluster bus port (+10000) is free too, neither of them in `taken`."""
    for _ in range(200):
        port = find_free_port(HOST)
        bus_port = port + BUS_PORT_OFFSET
        if port > MAX_PORT or port in taken or bus_port in taken:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((HOST, bus_port))
            except OSError:
                continue
        return port
    raise RuntimeError("found no free port with a free cluster bus port")


class ClusterNode(RedisServer):
    """One `redis-server` of the cluster: a `RedisServer` with cluster mode on, and its cluster node id."""

    def __init__(self, port: int, *, data_dir: Path, node_timeout_ms: int) -> None:
        super().__init__(port, host=HOST, appendonly=True, data_dir=data_dir)
        self.node_timeout_ms = node_timeout_ms
        # CLUSTER MYID once started; kept in nodes.conf, so a restart keeps it.
        self.node_id = ""

    @property
    def bus_port(self) -> int:
        """The port of its cluster bus."""
        return self.port + BUS_PORT_OFFSET

    def build_command(self) -> list[str]:
        """The `RedisServer` command line, in cluster mode; no delay before a full sync to a replica (the
        default waits five seconds for more replicas to share it)."""
        return [
            *super().build_command(),
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            str(self.node_timeout_ms),
            # Keep the pairs `replica_of` names: no replica wanders off to another master.
            "--cluster-allow-replica-migration",
            "no",
            "--repl-diskless-sync-delay",
            "0",
        ]


class Entry(NamedTuple):
    """One line of CLUSTER NODES: a node, its role, its master's id (replicas) and its slot ranges."""

    node_id: str
    role: str
    master_id: str
    slots: tuple[tuple[int, int], ...]


class RedisCluster:
    """`masters` masters with one replica each, made a Redis Cluster by `redis-cli --cluster create`."""

    def __init__(self, *, masters: int = 3, node_timeout_ms: int = 1000) -> None:
        self.node_timeout_ms = node_timeout_ms
        self.dir = Path(tempfile.mkdtemp(prefix="toolloop-cluster-"))
        self.nodes: list[ClusterNode] = []
        self.size = masters * 2
        self._clients: dict[int, redis.Redis] = {}
        self._cluster_clients: list[redis.cluster.RedisCluster] = []

    @property
    def url(self) -> str:
        """`redis://host:port/0` of the first node: any node names the cluster to a cluster client."""
        return self.nodes[0].url

    @property
    def urls(self) -> list[str]:
        """Every node's URL."""
        return [node.url for node in self.nodes]

    # --- lifecycle ---------------------------------------------------------------------------------------

    def start(self) -> RedisCluster:
        """Start the nodes, create the cluster, and return once it has `settled`."""
        try:
            for index in range(self.size):
                node = self._start_node(index)
                self.nodes.append(node)
                node.node_id = str(self.node_client(node).cluster("MYID"))
            self._create()
            self.ready()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Close the clients, stop every node, remove the temp dir."""
        for cluster_client in self._cluster_clients:
            cluster_client.close()
        self._cluster_clients = []
        for client in self._clients.values():
            client.close()
        self._clients = {}
        for node in self.nodes:
            node.stop(keep_data=True)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RedisCluster:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # --- who leads -------------------------------------------------------------------------------------

    def masters(self) -> list[ClusterNode]:
        """The nodes serving slots, as the first node that answers describes them, lowest slots first."""
        entries = self._entries_of_any()
        masters = sorted((e for e in entries if e.role == "master" and e.slots), key=lambda e: e.slots[0])
        return [self._node(entry.node_id) for entry in masters]

    def replica_of(self, master: ClusterNode) -> ClusterNode:
        """The node replicating `master`, as the first node that answers describes it."""
        for entry in self._entries_of_any():
            if entry.role == "replica" and entry.master_id == master.node_id:
                return self._node(entry.node_id)
        raise LookupError(f"no replica of port {master.port}")

    def master_of(self, key: str) -> ClusterNode:
        """The master serving `key`'s slot (redis-py's CRC16 of its hash tag, Redis's own rule), as the first
        node that answers describes the cluster."""
        slot = key_slot(key.encode())
        for entry in self._entries_of_any():
            if entry.role == "master" and any(first <= slot <= last for first, last in entry.slots):
                return self._node(entry.node_id)
        raise LookupError(f"no master serves slot {slot} ({key!r})")

    def client(self) -> redis.cluster.RedisCluster:
        """A cluster client (decoded replies; it learns every node from the first) for the test's own checks,
        closed with the cluster."""
        client = redis.cluster.RedisCluster(
            host=HOST,
            port=self.nodes[0].port,
            decode_responses=True,
            socket_timeout=5,
            socket_connect_timeout=1,
        )
        self._cluster_clients.append(client)
        return client

    def node_client(self, node: ClusterNode) -> redis.Redis:
        """A plain client of one node (decoded replies): no redirects followed; closed with the cluster."""
        client = self._clients.get(node.port)
        if client is None:
            # One client per port for the cluster's life (a restarted node keeps its port).
            client = self._clients[node.port] = redis.Redis(
                host=HOST, port=node.port, decode_responses=True, socket_timeout=5, socket_connect_timeout=1
            )
        return client

    # --- what they served ------------------------------------------------------------------------------

    def command_counts(self) -> dict[int, int]:
        """{port of each current master: the commands it ran since its start or `reset_stats`}: the `calls` of
        INFO commandstats (a command refused before it ran, such as one answered MOVED, is a `rejected_call`
        and not counted), less the `HOUSEKEEPING_COMMANDS` (the fixture's probes, the cluster client's
        discovery of the slots, replication)."""
        counts: dict[int, int] = {}
        for master in self.masters():
            stats = self.node_client(master).info("commandstats")
            counts[master.port] = sum(
                int(stat["calls"])
                for name, stat in stats.items()
                if name.removeprefix("cmdstat_").split("|")[0] not in HOUSEKEEPING_COMMANDS
            )
        return counts

    def cpu_seconds(self) -> dict[int, float]:
        """{port of each current master: its CPU seconds so far (`used_cpu_sys` + `used_cpu_user`)}: a
        difference of two readings is what it spent in between (CONFIG RESETSTAT does not reset it)."""
        out: dict[int, float] = {}
        for master in self.masters():
            cpu = self.node_client(master).info("cpu")
            out[master.port] = float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"])
        return out

    def reset_stats(self) -> None:
        """CONFIG RESETSTAT on every node."""
        for node in self.nodes:
            self.node_client(node).config_resetstat()

    # --- failing over --------------------------------------------------------------------------------------

    def ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Block until the cluster has `settled` (see the module docstring)."""
        self._wait("the cluster settled", self.settled, timeout_s)

    def failover(self, master: ClusterNode, timeout_s: float = READY_TIMEOUT_S) -> ClusterNode:
        """Once `ready`, CLUSTER FAILOVER on the replica of `master` (which first catches up with it: nothing
        written is lost); returns that replica, the new master, once every node agrees that it leads with the
        old master as its replica, and the cluster has settled."""
        self.ready(timeout_s)
        replica = self.replica_of(master)

        def promoted() -> bool:
            # Asked again after a try that timed out, it may have been promoted meanwhile (and would refuse).
            if self._role(replica) == "master":
                return True
            self.node_client(replica).cluster("FAILOVER")
            return _poll(lambda: self._role(replica) == "master", MANUAL_FAILOVER_S)

        self._wait(f"port {replica.port} promoted by CLUSTER FAILOVER", promoted, timeout_s)
        self._wait(
            f"port {replica.port} leading port {master.port}, settled",
            lambda: self.settled() and self._leads(replica, master),
            timeout_s,
        )
        return replica

    def kill_master(self, master: ClusterNode, timeout_s: float = READY_TIMEOUT_S) -> ClusterNode:
        """Once `ready`, SIGKILL `master`; when every other node names its replica master and says
        `cluster_state:ok`, restart it (its data and nodes.conf kept, as a supervisor would): it rejoins as
        the replica of the promoted one. Returns the new master once the cluster has settled."""
        self.ready(timeout_s)
        replica = self.replica_of(master)
        master.kill()
        self._wait(
            f"port {replica.port} promoted in place of the killed port {master.port}",
            lambda: self._promoted(replica, without=master),
            timeout_s,
        )
        master.start()
        self._wait(
            f"port {master.port} back as the replica of port {replica.port}, settled",
            lambda: self.settled() and self._leads(replica, master),
            timeout_s,
        )
        return replica

    def settled(self) -> bool:
        """Whether every node says the cluster is ok and describes it alike, each master has one replica,
        and every replica's link is up (see the module docstring)."""
        if not all(self._cluster_ok(node, known=self.size) for node in self.nodes):
            return False
        views = [self._view(node) for node in self.nodes]
        first = views[0]
        if first is None or any(view != first for view in views):
            return False
        masters = [entry for entry in first if entry.role == "master" and entry.slots]
        replicas = [entry for entry in first if entry.role == "replica"]
        if sorted(entry.master_id for entry in replicas) != sorted(entry.node_id for entry in masters):
            return False
        return all(
            self._link_up(self._node(entry.node_id), self._node(entry.master_id)) for entry in replicas
        )

    def describe(self) -> str:
        """What each node says of the others (or why it does not): for a failure's message."""
        parts: list[str] = []
        for node in self.nodes:
            parts.append(f"port {node.port} (pid {node.pid}, id {node.node_id}):")
            try:
                for address, line in self.node_client(node).cluster("NODES").items():
                    parts.append(
                        f"  {address} {line['node_id']} {line['flags']} master {line['master_id']}"
                        f" slots {line['slots']} {'connected' if line['connected'] else 'disconnected'}"
                    )
            except redis.RedisError as error:
                parts.append(f"  {error!r}")
        return "\n".join(parts)

    # --- helpers -------------------------------------------------------------------------------------------

    def _start_node(self, index: int) -> ClusterNode:
        # A port from find_free_cluster_port (or its bus port) can be taken before redis-server binds it;
        # then try another pair.
        for attempt in range(1, 4):
            taken = {port for node in self.nodes for port in (node.port, node.bus_port)}
            node = ClusterNode(
                find_free_cluster_port(taken),
                data_dir=self.dir / f"node{index}",
                node_timeout_ms=self.node_timeout_ms,
            )
            try:
                node.start()
            except PortUnavailableError:
                if attempt == 3:
                    raise
                continue
            return node
        raise AssertionError("unreachable: the last try returns or raises")

    def _create(self) -> None:
        command = [
            find_redis_cli(),
            "--cluster",
            "create",
            *(f"{HOST}:{node.port}" for node in self.nodes),
            "--cluster-replicas",
            "1",
            "--cluster-yes",
        ]
        result = subprocess.run(command, capture_output=True, text=True, timeout=READY_TIMEOUT_S, check=False)
        if result.returncode != 0:
            raise RuntimeError(
                f"redis-cli --cluster create exited with {result.returncode}:\n{result.stdout}{result.stderr}"
            )

    def _wait(self, what: str, done: Callable[[], bool], timeout_s: float) -> None:
        def check() -> bool:
            with contextlib.suppress(redis.RedisError, LookupError, StopIteration):
                return done()
            return False

        if not _poll(check, timeout_s):
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}\n{self.describe()}")

    def _node(self, node_id: str) -> ClusterNode:
        for node in self.nodes:
            if node.node_id == node_id:
                return node
        raise LookupError(f"no node with id {node_id}")

    def _lines(self, node: ClusterNode) -> list[tuple[Entry, bool]]:
        # CLUSTER NODES of `node`: each node it knows, and whether it flags that one failing or unreachable.
        lines: list[tuple[Entry, bool]] = []
        for line in self.node_client(node).cluster("NODES").values():
            flags = set(line["flags"].split(","))
            # A range is "first-last", a single slot just "slot".
            slots = tuple((int(bounds[0]), int(bounds[-1])) for bounds in line["slots"])
            role = "master" if "master" in flags else "replica"
            master_id = line["master_id"] if role == "replica" else ""
            trouble = bool(flags & TROUBLE_FLAGS) or not line["connected"]
            lines.append((Entry(line["node_id"], role, master_id, slots), trouble))
        return lines

    def _view(self, node: ClusterNode) -> frozenset[Entry] | None:
        """What `node` says of the cluster; None if it flags some node as failing or unreachable."""
        lines = self._lines(node)
        if any(trouble for _, trouble in lines):
            return None
        return frozenset(entry for entry, _ in lines)

    def _entries_of_any(self) -> frozenset[Entry]:
        for node in self.nodes:
            with contextlib.suppress(redis.RedisError):
                view = self._view(node)
                if view is not None:
                    return view
        raise LookupError("no node describes the cluster without a failing node")

    def _cluster_ok(self, node: ClusterNode, *, known: int) -> bool:
        info = self.node_client(node).cluster("INFO")
        return (
            info["cluster_state"] == "ok"
            and int(info["cluster_slots_ok"]) == SLOTS
            and int(info["cluster_known_nodes"]) == known
        )

    def _role(self, node: ClusterNode) -> str:
        return str(self.node_client(node).info("replication")["role"])

    def _link_up(self, replica: ClusterNode, master: ClusterNode) -> bool:
        info = self.node_client(replica).info("replication")
        return (
            info.get("role") == "slave"
            and int(info.get("master_port", 0)) == master.port
            and info.get("master_link_status") == "up"
        )

    def _leads(self, new: ClusterNode, old: ClusterNode) -> bool:
        # In the (agreed) view of any node: `new` serves slots and `old` replicates it.
        entries = {entry.node_id: entry for entry in self._entries_of_any()}
        return (
            entries[new.node_id].role == "master"
            and bool(entries[new.node_id].slots)
            and entries[old.node_id].master_id == new.node_id
        )

    def _promoted(self, replica: ClusterNode, *, without: ClusterNode) -> bool:
        # Every node but the dead one says the cluster is ok and names `replica` a master with slots.
        for node in self.nodes:
            if node is without:
                continue
            if not self._cluster_ok(node, known=self.size):
                return False
            entry = next(entry for entry, _ in self._lines(node) if entry.node_id == replica.node_id)
            if entry.role != "master" or not entry.slots:
                return False
        return True


def _poll(check: Callable[[], bool], timeout_s: float) -> bool:
    # Whether `check()` came true within `timeout_s`.
    deadline = time.monotonic() + timeout_s
    while True:
        if check():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_S)
