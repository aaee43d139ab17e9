"""A whole airuntime system as real processes, with the faults the chaos test injects.

Why this module exists: the chaos test and ``benchmarks/recovery.py`` need the same
thing -- a Valkey with an append-only file on a fixed port (or, with
``ClusterConfig(valkey_cluster=True)``, a 3-master + 3-replica Valkey Cluster reached by
a ``redis+cluster://`` URL), ``airt control-plane`` (background pump on) on a fixed
port, and ``airt runtime`` processes with the ``http`` provider and a runtime token --
plus ways to break each of them: ``kill -9`` and restart, ``SIGSTOP``/``SIGCONT``, a
Valkey stopped and started on the same address (or frozen), a cluster master failing
over.

Submissions go through the control plane's HTTP API while the faults happen, each with
an ``Idempotency-Key`` of its own: a POST cut by a kill, timed out by a frozen Valkey or
refused (503) is sent again with the same key until it is answered, and the key makes
it one run whether or not the first attempt created it -- so the test knows exactly
which runs exist. (Before the keys, submissions and faults took turns.)
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
from redis.exceptions import RedisError

from airuntime.core import keys
from airuntime.core.redis_client import RedisClient, connect
from airuntime.devstack.child_process import free_port
from airuntime.devstack.cluster import LocalCluster
from tests.chaos import effects
from tests.runtime.restartable import RestartableValkey
from tests.runtime.support import AIRT, subprocess_env

T = TypeVar("T")

REPO = Path(__file__).resolve().parents[2]
API_TOKEN = "chaos-admin-token"
RUNTIME_TOKEN = "chaos-runtime-token"
PREFIX = "chaos"
STEPS = ("root", "a", "b", "c", "sink")


@dataclass(frozen=True)
class ClusterConfig:
    runtimes: int = 3
    workers: int = 8
    max_concurrent_runs: int = 6
    heartbeat_s: float = 0.5
    """The registry entry expires after three heartbeats without one (1.5 s)."""
    lease_ms: int = 2000
    delivery_timeout_s: float = 2.0
    valkey_cluster: bool = False
    """A Valkey Cluster (3 masters, 3 replicas) instead of one Valkey."""

    @property
    def heartbeat_ttl_s(self) -> float:
        return 3 * self.heartbeat_s


@dataclass
class Proc:
    name: str
    process: asyncio.subprocess.Process
    log: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""


def pipeline(db: str, sleeps: tuple[float, float, float] = (0.02, 0.15, 0.3)) -> dict[str, Any]:
    """root -> a, b, c -> sink: five ``python`` steps, each recording its effect; the
    middle ones sleep so that faults hit running work."""

    def step(sid: str, after_s: float, deps: list[str]) -> dict[str, Any]:
        kwargs = {"db": db, "n": "${inputs.n}", "before_s": after_s / 2, "after_s": after_s}
        return {
            "id": sid,
            "uses": "python",
            "depends_on": deps,
            "with": {"callable": "tests.chaos.effects:record", "kwargs": kwargs},
        }

    fast, mid, slow = sleeps
    return {
        "id": "chaos",
        "steps": [
            step("root", fast, []),
            step("a", fast, ["root"]),
            step("b", mid, ["root"]),
            step("c", slow, ["root"]),
            step("sink", fast, ["a", "b", "c"]),
        ],
    }


class ChaosValkeyCluster:
    """The store of a chaos run on a Valkey Cluster: what :class:`Cluster` needs of its
    Valkey (``url``, ``start``, ``kill``) plus a failover fault. The failover is planned
    (``CLUSTER FAILOVER``: the replica catches up, then takes the master's slots), so
    nothing acknowledged is lost and the test can still require every submitted run;
    an unplanned one (a master killed) may lose the last writes before it, which the
    engine's own failover test covers."""

    def __init__(self) -> None:
        self.local = LocalCluster(shards=3, replicas=1)

    @property
    def url(self) -> str:
        return self.local.url

    async def start(self) -> None:
        await asyncio.to_thread(self.local.start)

    def kill(self) -> None:
        self.local.stop()

    async def fail_over(self, rng: Any) -> str:
        master = rng.choice(sorted(await asyncio.to_thread(self.local.masters)))
        new = await asyncio.to_thread(self.local.failover, master)
        return f"cluster master {master} failed over to its replica {new}"


@dataclass
class Cluster:
    """Valkey + control plane + runtimes under ``root`` (logs in ``root/logs``)."""

    root: Path
    config: ClusterConfig = field(default_factory=ClusterConfig)
    valkey: RestartableValkey | ChaosValkeyCluster = field(init=False)
    api_port: int = field(init=False, default_factory=free_port)
    control_plane: Proc | None = field(init=False, default=None)
    runtimes: dict[str, Proc] = field(init=False, default_factory=dict)
    _next_runtime: int = field(init=False, default=0)
    replayed: int = field(init=False, default=0)
    """Submissions answered with the run an earlier attempt had created (printed)."""
    redis: RedisClient = field(init=False)

    def __post_init__(self) -> None:
        self.valkey = (
            ChaosValkeyCluster()
            if self.config.valkey_cluster
            else RestartableValkey(self.root / "valkey")
        )
        (self.root / "logs").mkdir(parents=True, exist_ok=True)
        self.db = str(self.root / "effects.db")
        self.api = httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{self.api_port}",
            headers={"authorization": f"Bearer {API_TOKEN}"},
            timeout=10,
        )

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        effects.create(self.db)
        self._write_config()
        await self.valkey.start()
        self.redis = connect(self.valkey.url)
        await self.start_control_plane()
        for _ in range(self.config.runtimes):
            await self.start_runtime()

    async def stop(self) -> None:
        for proc in [*self.runtimes.values(), self.control_plane]:
            if proc is not None and proc.process.returncode is None:
                proc.process.send_signal(signal.SIGCONT)
                proc.process.kill()
                await proc.process.wait()
        self.runtimes.clear()
        self.control_plane = None
        self.valkey.kill()
        await self.api.aclose()
        await self.redis.aclose()

    def _write_config(self) -> None:
        tokens = {"tokens": [{"token": API_TOKEN, "user": "chaos", "tenant": "default"}]}
        tokens["tokens"][0]["roles"] = ["admin"]
        (self.root / "tokens.json").write_text(json.dumps(tokens))
        tenant = {
            "tenant_id": "default",
            "isolation_mode": "Shared",
            "max_instances": 10,
            "runtime_prefix": PREFIX,
            "allowed_handlers": ["noop", "sleep", "echo", "python"],
        }
        (self.root / "tenants.json").write_text(json.dumps({"tenants": [tenant]}))

    def _env(self, **extra: str) -> dict[str, str]:
        pythonpath = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
        return subprocess_env(
            self.valkey.url,
            PYTHONPATH=pythonpath,
            AIRUNTIME_PYTHON_HANDLER_MODULES="tests.chaos",
            AIRUNTIME_RUNTIME_TOKEN=RUNTIME_TOKEN,
            **extra,
        )

    async def _spawn(self, name: str, args: list[str], env: dict[str, str]) -> Proc:
        log = self.root / "logs" / f"{name}.log"
        with log.open("ab") as out:
            process = await asyncio.create_subprocess_exec(
                AIRT, *args, env=env, cwd=REPO, stdout=out, stderr=out
            )
        return Proc(name, process, log)

    # -- control plane -----------------------------------------------------------------

    async def start_control_plane(self) -> None:
        home = self.root / "cp"
        home.mkdir(exist_ok=True)
        env = self._env(
            AIRUNTIME_HOME=str(home),
            AIRUNTIME_API_PORT=str(self.api_port),
            AIRUNTIME_TOKENS_FILE=str(self.root / "tokens.json"),
            AIRUNTIME_TENANTS_FILE=str(self.root / "tenants.json"),
            AIRUNTIME_SCALE_OUT_ENABLED="false",
            AIRUNTIME_BACKGROUND_PUMP="true",
            AIRUNTIME_RECONCILE_INTERVAL_S="1",
            AIRUNTIME_DELIVERY_TIMEOUT_S=str(self.config.delivery_timeout_s),
            AIRUNTIME_DELIVERY_FAILURES_BEFORE_SUSPECT="2",
            AIRUNTIME_SUSPECT_INITIAL_S="1",
            AIRUNTIME_SUSPECT_MAX_S="5",
        )
        self.control_plane = await self._spawn("control-plane", ["control-plane"], env)
        await self.wait_ready()

    async def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Until the control plane's ``/readyz`` answers 200."""

        async def ready() -> bool:
            try:
                return (await self.api.get("/readyz")).status_code == 200
            except httpx.HTTPError:
                return False

        await until(ready, timeout_s, "the control plane ready", self.control_plane)

    async def kill_control_plane(self) -> None:
        assert self.control_plane is not None
        self.control_plane.process.kill()
        await self.control_plane.process.wait()

    # -- runtimes ----------------------------------------------------------------------

    async def start_runtime(self) -> str:
        """A new ``airt runtime`` (``chaos-<n>``, never a reused id); waits until it is
        registered and can accept a run."""
        self._next_runtime += 1
        iid = f"{PREFIX}-{self._next_runtime}"
        home = self.root / iid
        home.mkdir(exist_ok=True)
        c = self.config
        env = self._env(
            AIRUNTIME_HOME=str(home),
            AIRUNTIME_INSTANCE_ID=iid,
            AIRUNTIME_RUNTIME_PREFIX=PREFIX,
            AIRUNTIME_PROVIDER="http",
            AIRUNTIME_WORKERS=str(c.workers),
            AIRUNTIME_MAX_CONCURRENT_RUNS=str(c.max_concurrent_runs),
            AIRUNTIME_HEARTBEAT_S=str(c.heartbeat_s),
            AIRUNTIME_LEASE_MS=str(c.lease_ms),
        )
        proc = await self._spawn(iid, ["runtime"], env)
        self.runtimes[iid] = proc

        async def registered() -> bool:
            raw = await self.redis.get(keys.instance(iid))
            return raw is not None and json.loads(raw)["capacity"]["can_accept_run"] is True

        await until(lambda: retrying(registered), 60, f"{iid} registered", proc)
        return iid

    async def kill_runtime(self, iid: str) -> None:
        proc = self.runtimes.pop(iid)
        proc.process.kill()
        await proc.process.wait()

    def freeze(self, iid: str) -> None:
        self.runtimes[iid].process.send_signal(signal.SIGSTOP)

    def thaw(self, iid: str) -> None:
        self.runtimes[iid].process.send_signal(signal.SIGCONT)

    # -- Valkey ------------------------------------------------------------------------

    def stop_valkey(self, *, kill: bool) -> None:
        assert isinstance(self.valkey, RestartableValkey)
        if kill:
            self.valkey.kill()
        else:
            self.valkey.stop()

    async def start_valkey(self) -> None:
        await self.valkey.start()

    def freeze_valkey(self) -> None:
        """SIGSTOP: connections stay open and nothing answers (a hung server, a network
        that drops packets) -- until :meth:`thaw_valkey`."""
        assert isinstance(self.valkey, RestartableValkey)
        self.valkey.signal(signal.SIGSTOP)

    def thaw_valkey(self) -> None:
        assert isinstance(self.valkey, RestartableValkey)
        self.valkey.signal(signal.SIGCONT)

    async def fail_over(self, rng: Any) -> str:
        """A planned failover of a random master of the cluster (see
        :class:`ChaosValkeyCluster`); what happened, for the log."""
        assert isinstance(self.valkey, ChaosValkeyCluster)
        return await self.valkey.fail_over(rng)

    # -- submissions -------------------------------------------------------------------

    async def submit(self, n: int, doc: dict[str, Any], timeout_s: float = 120.0) -> str:
        """POST one run (inputs ``{"n": n}``, the key ``run-<n>``); sent again, with the
        same key, after any failure -- a refused or cut connection, a timeout, a 503."""
        deadline = time.monotonic() + timeout_s
        body = {"pipeline": doc, "inputs": {"n": n}}
        while True:
            try:
                r = await self.api.post(
                    "/v1/runs", json=body, headers={"idempotency-key": f"run-{n}"}
                )
            except httpx.TransportError:
                r = None
            if r is not None and r.status_code == 202:
                self.replayed += bool(r.json()["replayed"])
                return str(r.json()["shared_run_id"])
            if r is not None and r.status_code != 503:
                raise AssertionError(f"submit {n}: {r.status_code} {r.text}")
            if time.monotonic() > deadline:
                raise AssertionError(f"submit {n}: still refused after {timeout_s} s")
            await asyncio.sleep(0.1)


async def retrying(probe: Callable[[], Awaitable[T]]) -> T | None:
    """``probe()``, or None while Redis cannot answer (down, loading, a stale connection)."""
    try:
        return await probe()
    except (RedisError, OSError):
        return None


async def until(
    probe: Callable[[], Awaitable[Any]], timeout_s: float, what: str, proc: Proc | None = None
) -> None:
    """Poll ``probe`` until truthy; on timeout fail with the process's log tail."""
    deadline = time.monotonic() + timeout_s
    while not await probe():
        if proc is not None and proc.process.returncode is not None:
            raise AssertionError(f"{proc.name} exited ({proc.process.returncode}):\n{proc.tail()}")
        if time.monotonic() > deadline:
            tail = f"\n{proc.name}:\n{proc.tail()}" if proc is not None else ""
            raise AssertionError(f"not reached within {timeout_s} s: {what}{tail}")
        await asyncio.sleep(0.05)
