"""How ``airt up`` and ``airt run`` end when something ends under them, or they are asked.

* **Their embedded Valkey dies under them.** It is their only store: once it is gone
  every call is refused, and before this the stack answered 503 "retry later" forever
  (its loops retrying a server that would not come back, the dead server a zombie)
  and a run either hung or ended "cannot reach Redis". Here the real server is killed
  (SIGKILL) under the real commands; each ends, exit 1, with the reason and whether
  the data survived. A stop asked for (SIGINT, as Ctrl-C or ``airt demo``) is no loss.
* **Ctrl-C while a client follows a run.** The followed event stream of a run waiting
  for input never ends on its own; the server's shutdown used to wait on it, and
  ``airt up`` did not stop.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from airuntime.core.settings import HOME_ENV, REDIS_URL_ENV
from tests.polling import wait_until

LOST = "the embedded Valkey (pid {pid}) exited unexpectedly (killed by SIGKILL)"


def _start(home: Path, *args: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRUNTIME_")}
    env.pop(REDIS_URL_ENV, None)
    return subprocess.Popen(
        [sys.executable, "-m", "airuntime.cli", *args],
        env={**env, HOME_ENV: str(home), "COLUMNS": "200"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _server_pid(redis_url: str) -> int:
    client = redis.Redis.from_url(redis_url)
    try:
        return int(client.info("server")["process_id"])
    finally:
        client.close()


def _running_execution_server(parent: int) -> int | None:
    """The pid of ``parent``'s valkey-server child (from /proc; the server's title names
    its socket) once it serves the run's execution: killed while it starts, the
    server would be started again, and the run would go on."""
    try:
        for task in Path(f"/proc/{parent}/task").iterdir():
            for pid in (task / "children").read_text().split():
                title = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
                if "valkey-server" in title and "unixsocket:" in title:
                    path = title.split("unixsocket:", 1)[1].split()[0].rstrip("\x00")
                    client = redis.Redis(unix_socket_path=path)
                    try:
                        return int(pid) if client.dbsize() > 0 else None
                    finally:
                        client.close()
    except (FileNotFoundError, redis.ConnectionError):  # not there yet: look again
        pass
    return None


def _ended(proc: subprocess.Popen[str]) -> tuple[int, str]:
    _, stderr = proc.communicate(timeout=120)
    return proc.returncode, " ".join(stderr.split())


def _up(home: Path, *args: str) -> tuple[subprocess.Popen[str], dict[str, object]]:
    proc = _start(home, "up", "--port", "0", *args)
    state = home / "up.json"
    wait_until(lambda: state.exists() or proc.poll() is not None, what="airt up's state file")
    assert proc.poll() is None, proc.communicate()
    return proc, json.loads(state.read_text())


@pytest.mark.parametrize("data_dir", [False, True], ids=["in-memory", "data-dir"])
def test_airt_up_ends_with_the_reason_when_its_server_is_killed(
    tmp_path: Path, data_dir: bool
) -> None:
    data = tmp_path / "data"
    proc, state = _up(tmp_path, *(["--data-dir", str(data)] if data_dir else []))
    try:
        pid = _server_pid(str(state["redis_url"]))
        os.kill(pid, signal.SIGKILL)
        code, stderr = _ended(proc)
    finally:
        proc.kill()
    assert code == 1, stderr
    assert "error: " + LOST.format(pid=pid) in stderr, stderr
    kept = f"its data in {data} is kept" if data_dir else "its data, held in memory only, is gone"
    assert kept in stderr, stderr
    assert not (tmp_path / "up.json").exists()  # stopped as on Ctrl-C: state removed


def test_a_stop_asked_for_is_not_a_lost_server(tmp_path: Path) -> None:
    proc, _ = _up(tmp_path)
    proc.send_signal(signal.SIGINT)
    code, stderr = _ended(proc)
    assert code == 0, stderr
    assert "exited unexpectedly" not in stderr, stderr


def test_airt_run_ends_with_the_reason_when_its_server_is_killed(tmp_path: Path) -> None:
    pipeline = tmp_path / "slow.yaml"
    pipeline.write_text("id: slow\nsteps:\n  - {id: wait, uses: sleep, with: {seconds: 600}}\n")
    proc = _start(tmp_path, "run", str(pipeline))
    try:
        found: list[int] = []

        def server_started() -> bool:
            pid = _running_execution_server(proc.pid)
            found[:] = [pid] if pid else []
            return bool(found) or proc.poll() is not None

        wait_until(server_started, what="airt run's execution in its embedded server")
        assert found, proc.communicate()
        os.kill(found[0], signal.SIGKILL)
        code, stderr = _ended(proc)  # long before the step's 600 s
    finally:
        proc.kill()
    assert code == 1, stderr
    assert "error: " + LOST.format(pid=found[0]) in stderr, stderr


def test_ctrl_c_stops_airt_up_while_a_client_follows_a_run(tmp_path: Path) -> None:
    # The followed stream of a run waiting for input never ends on its own: before,
    # the server's shutdown waited on it and `airt up` did not stop on Ctrl-C.
    proc, state = _up(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRUNTIME_")}
    env = {**env, HOME_ENV: str(tmp_path), "COLUMNS": "200"}
    cli = [sys.executable, "-m", "airuntime.cli"]
    follower: subprocess.Popen[str] | None = None
    try:
        submitted = subprocess.run(
            [*cli, "submit", "human-input", "--tenant", "tenant-a"],
            env=env, capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        srid = json.loads(submitted.stdout)["shared_run_id"]
        follower = subprocess.Popen(
            [*cli, "runs", "events", srid, "--tenant", "tenant-a", "--follow", "--json"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert follower.stdout is not None
        while True:  # followed up to the input wait
            line = follower.stdout.readline()
            assert line, follower.communicate(timeout=10)
            if json.loads(line)["type"] == "input_requested":
                break
        proc.send_signal(signal.SIGINT)
        code, stderr = _ended(proc)
        assert code == 0, stderr
        assert not (tmp_path / "up.json").exists()
    finally:
        proc.kill()
        if follower is not None:
            follower.kill()
    assert state["api_url"]
