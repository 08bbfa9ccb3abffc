"""A Redis behind Sentinel for tests: a master, a replica and three sentinels, all the one `redis-server`.

    with SentinelCluster() as cluster:                 # free ports, config files in a temp dir
        use(cluster.url, cluster.master_name)          # sentinel://127.0.0.1:p1;…;sentinel://127.0.0.1:p3/0
        cluster.failover()                             # SENTINEL FAILOVER; returns once they switched
        cluster.kill_master()                          # SIGKILL; returns once they elected the replica
        cluster.failovers()                            # how many failovers the sentinels made, asked or not

The data nodes are `orchestrator.redis_server.RedisServer`s (AOF on); the sentinels run `redis-server <conf>
--sentinel` (Sentinel rewrites its configuration file, so each has its own in the temp dir). Each way of
failing over first waits until the sentinels see a healthy replica to promote (`ready`), and leaves the old
master replicating from the new one (after SENTINEL FAILOVER the sentinels demote it themselves, about ten
seconds on; a killed one is restarted as a replica, in sync when `kill_master` returns).

The sentinels wait `DOWN_AFTER_MS` without an answer before they call a master down. A wait of one second
let a loaded machine fool them: a master just elected, slow to answer for a second, was failed over again,
to the killed master restarted a moment before and not yet in sync, and everything written since the first
failover was gone. `failovers` counts what they did, so that a test tells such a failover from its own.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

import redis

from orchestrator.redis_server import RedisServer, find_free_port, find_redis_server
from tests.support.waiting import wait_until

HOST = "127.0.0.1"
# How long a node may not answer before the sentinels call it down: a killed master is failed over that much
# later, a live one that a loaded machine stalls for a second or two is not.
DOWN_AFTER_MS = 5000
# Generous: two cores shared with other suites can put the sentinels in TILT mode (30 s of no decisions).
READY_TIMEOUT_S = 90.0
MASTER_NAME = "toolloop"


class SentinelCluster:
    """Two data nodes (one master, one replica) and `sentinels` sentinels watching them."""

    def __init__(
        self,
        *,
        master_name: str = MASTER_NAME,
        sentinels: int = 3,
        quorum: int = 2,
        down_after_ms: int = DOWN_AFTER_MS,
        failover_timeout_ms: int = 3000,
    ) -> None:
        self.master_name = master_name
        self.quorum = quorum
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self.executable = find_redis_server()
        self.dir = Path(tempfile.mkdtemp(prefix="toolloop-sentinel-"))
        self.nodes = [RedisServer(appendonly=True, data_dir=self.dir / f"node{i}") for i in range(2)]
        self.sentinel_ports = [find_free_port(HOST) for _ in range(sentinels)]
        self.sentinel_processes: list[subprocess.Popen[bytes]] = []
        self._clients: dict[int, redis.Redis] = {}

    @property
    def url(self) -> str:
        """The Sentinel URL of the cluster, in Celery's form."""
        return ";".join(f"sentinel://{HOST}:{port}" for port in self.sentinel_ports) + "/0"

    # --- lifecycle ---------------------------------------------------------------------------------------

    def start(self) -> SentinelCluster:
        """Start the master, its replica (in sync on return), then the sentinels (agreed on return)."""
        try:
            master, replica = self.nodes
            master.start()
            replica.start()
            self._client(replica).replicaof(HOST, master.port)
            self._wait("the replica in sync", lambda: self._replicating(replica, master), READY_TIMEOUT_S)
            for port in self.sentinel_ports:
                self.sentinel_processes.append(self._start_sentinel(port, master.port))
            self.ready()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the sentinels and the data nodes; remove the temp dir."""
        for process in self.sentinel_processes:
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(timeout=5)
        self.sentinel_processes = []
        for client in self._clients.values():
            client.close()
        self._clients = {}
        for node in self.nodes:
            node.stop(keep_data=True)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> SentinelCluster:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # --- who leads -------------------------------------------------------------------------------------

    def master_port(self) -> int:
        """The port of the master the first sentinel that answers names."""
        for port in self.sentinel_ports:
            with contextlib.suppress(redis.RedisError):
                address = self._sentinel(port).sentinel_get_master_addr_by_name(self.master_name)
                if isinstance(address, tuple):
                    return int(address[1])
        raise RuntimeError("no sentinel names a master")

    def master(self) -> RedisServer:
        """The data node the sentinels name as master."""
        port = self.master_port()
        return next(node for node in self.nodes if node.port == port)

    def replica(self) -> RedisServer:
        """The other data node."""
        port = self.master_port()
        return next(node for node in self.nodes if node.port != port)

    def master_client(self) -> redis.Redis:
        """A plain client of the current master (decoded replies), closed with the cluster."""
        return self._client(self.master())

    # --- failing over --------------------------------------------------------------------------------------

    def ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Block until every sentinel names the same master, knows the other sentinels, and sees the other
        node replicating from it in good health and holding every write made so far: until a failover has
        a replica to promote that loses nothing already acknowledged. (After a failover the sentinels learn
        the demoted master's state from its INFO, every ten seconds; a loaded machine can put them in TILT
        mode for thirty.)"""
        self._wait("the sentinels ready for a failover", self._ready, timeout_s)
        # The link being up says nothing of lag: on a loaded machine the replica can be a few hundred ms of
        # writes behind, and a turn submitted in them would be lost with the old master. Wait until the
        # replica has what the master had now; writes after this are the failover's "last moments".
        master, replica = self.master(), self.replica()
        written = int(self._client(master).info("replication")["master_repl_offset"])
        self._wait(
            f"port {replica.port} caught up with port {master.port}",
            lambda: int(self._client(replica).info("replication").get("slave_repl_offset", -1)) >= written,
            timeout_s,
        )

    def failover(self, timeout_s: float = READY_TIMEOUT_S) -> RedisServer:
        """Once `ready`, SENTINEL FAILOVER (the old master stays up, and takes writes until the sentinels
        reconfigure it, about ten seconds on); returns the new master once every sentinel names it."""
        _, new = self.begin_failover(timeout_s)
        self._wait(f"every sentinel naming port {new.port}", lambda: self.all_name(new.port), timeout_s)
        return new

    def begin_failover(self, timeout_s: float = READY_TIMEOUT_S) -> tuple[RedisServer, RedisServer]:
        """Once `ready`, send SENTINEL FAILOVER and return: (old master, the replica it promotes).

        A sentinel may still refuse while a failover is ending (INPROG) or its news of the replica is stale
        (NOGOODSLAVE): asked again until it accepts.
        """
        self.ready(timeout_s)
        old, new = self.master(), self.replica()

        def accepted() -> bool:
            try:
                sentinel = self._sentinel(self.sentinel_ports[0])
                sentinel.execute_command("SENTINEL FAILOVER", self.master_name)  # type: ignore[no-untyped-call]
            except redis.ResponseError:
                return False
            return True

        self._wait("SENTINEL FAILOVER accepted", accepted, timeout_s)
        return old, new

    def kill_master(self, timeout_s: float = READY_TIMEOUT_S) -> RedisServer:
        """Once `ready`, SIGKILL the master; when the sentinels have elected the replica, restart the old one
        (its data kept, as a supervisor would) as the new master's replica. Returns the new master once the
        old one is in sync with it: until then, promoting it would drop what the new master took."""
        self.ready(timeout_s)
        old, new = self.master(), self.replica()
        old.kill()
        self._wait(f"every sentinel naming port {new.port}", lambda: self.all_name(new.port), timeout_s)
        old.start()
        self._client(old).replicaof(HOST, new.port)
        self._wait(
            f"port {old.port} in sync with port {new.port}", lambda: self._replicating(old, new), timeout_s
        )
        return new

    def wait_switched(self, old: RedisServer, new: RedisServer, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Block until every sentinel names `new` and `old` replicates from it (the old master is demoted)."""
        self._wait(
            f"port {old.port} replicating from port {new.port}",
            lambda: self.all_name(new.port) and self._replicating(old, new),
            timeout_s,
        )

    def failovers(self) -> int:
        """How many failovers the sentinels have completed so far, asked for or not: the `+failover-end`
        lines of their logs (only the sentinel that led a failover writes one)."""
        return sum(
            "+failover-end" in line.split()
            for port in self.sentinel_ports
            for line in self._log(port).read_text(errors="replace").splitlines()
        )

    def all_name(self, port: int) -> bool:
        """Whether every sentinel names the node on `port` as the master."""
        for sentinel_port in self.sentinel_ports:
            try:
                address = self._sentinel(sentinel_port).sentinel_get_master_addr_by_name(self.master_name)
            except redis.RedisError:
                return False
            if not isinstance(address, tuple) or int(address[1]) != port:
                return False
        return True

    # --- helpers -------------------------------------------------------------------------------------------

    def _log(self, port: int) -> Path:
        return self.dir / f"sentinel-{port}.log"

    def _start_sentinel(self, port: int, master_port: int) -> subprocess.Popen[bytes]:
        conf = self.dir / f"sentinel-{port}.conf"
        conf.write_text(
            "\n".join(
                [
                    f"port {port}",
                    f"bind {HOST}",
                    "daemonize no",
                    f'dir "{self.dir}"',
                    f'logfile "{self._log(port)}"',
                    f"sentinel monitor {self.master_name} {HOST} {master_port} {self.quorum}",
                    f"sentinel down-after-milliseconds {self.master_name} {self.down_after_ms}",
                    f"sentinel failover-timeout {self.master_name} {self.failover_timeout_ms}",
                    f"sentinel parallel-syncs {self.master_name} 1",
                    "",
                ]
            )
        )
        process = subprocess.Popen(
            [self.executable, str(conf), "--sentinel"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )

        def answers() -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"sentinel on port {port} exited with {process.returncode}")
            with contextlib.suppress(redis.RedisError):
                return bool(self._sentinel(port).ping())
            return False

        try:
            wait_until(answers, f"the sentinel on port {port} to answer", 10)
        except AssertionError:
            process.kill()
            raise
        return process

    def _wait(self, what: str, done: Callable[[], bool], timeout_s: float) -> None:
        def check() -> bool:
            with contextlib.suppress(redis.RedisError, StopIteration, RuntimeError):
                return done()
            return False

        wait_until(check, what, timeout_s)

    def _ready(self) -> bool:
        master, replica = self.master(), self.replica()
        return self._replicating(replica, master) and all(
            self._sentinel_ready(port, master, replica) for port in self.sentinel_ports
        )

    def _sentinel_ready(self, port: int, master: RedisServer, replica: RedisServer) -> bool:
        # It names `master`, knows the other sentinels (a vote needs them), sees `replica` healthy.
        sentinel = self._sentinel(port)
        state = sentinel.sentinel_master(self.master_name)
        if not isinstance(state, dict):
            return False
        healthy = any(
            int(r["port"]) == replica.port
            and r["flags"] == "slave"
            and r["master-link-status"] == "ok"
            and int(r["master-port"]) == master.port
            for r in sentinel.sentinel_slaves(self.master_name)
        )
        return (
            int(state["port"]) == master.port
            and state["flags"] == "master"
            and int(state["num-other-sentinels"]) >= len(self.sentinel_ports) - 1
            and healthy
        )

    def _replicating(self, replica: RedisServer, master: RedisServer) -> bool:
        info = self._client(replica).info("replication")
        return (
            info.get("role") == "slave"
            and int(info.get("master_port", 0)) == master.port
            and info.get("master_link_status") == "up"
        )

    def _client(self, node: RedisServer) -> redis.Redis:
        return self._sentinel(node.port)

    def _sentinel(self, port: int) -> redis.Redis:
        # One client per port for the cluster's life (a data node restarted keeps its port).
        client = self._clients.get(port)
        if client is None:
            client = self._clients[port] = redis.Redis(
                host=HOST, port=port, decode_responses=True, socket_timeout=5, socket_connect_timeout=1
            )
        return client
