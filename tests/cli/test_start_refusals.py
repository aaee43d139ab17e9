"""``airt up``, ``airt control-plane`` and ``airt runtime`` refuse to start over something
already there, before they start anything: a port another process listens on (exit 2
naming the address, not the web server's exit 3, with a page of tracebacks once Redis
and the control plane had started), and, for ``airt up``, a stack still running in the
same ``AIRUNTIME_HOME`` (whose state file, tokens and URLs, a second stack would
replace)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from airuntime.core.settings import HOME_ENV, REDIS_URL_ENV

UNREACHABLE = "redis://127.0.0.1:1/0"
"""Never contacted: each command below is refused before it connects."""


def airt(home: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("AIRUNTIME_")}
    return subprocess.run(
        [sys.executable, "-m", "airuntime.cli", *args],
        env={**clean, "COLUMNS": "200", HOME_ENV: str(home), REDIS_URL_ENV: UNREACHABLE, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def refused(result: subprocess.CompletedProcess[str], *expected: str) -> str:
    shown = result.stdout + result.stderr
    assert result.returncode == 2, shown
    flat = " ".join(result.stderr.split())
    for text in expected:
        assert text in flat, flat
    assert "Traceback" not in shown and "Task was destroyed" not in shown, shown
    assert "airt up: Redis at" not in shown, "refused before anything started"
    return flat


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.create_server(("127.0.0.1", 0)) as sock:
        yield sock.getsockname()[1]


def test_a_port_in_use_is_refused_naming_the_address(tmp_path: Path, taken_port: int) -> None:
    address = f"cannot listen on 127.0.0.1:{taken_port}: Address already in use"
    refused(airt(tmp_path, "up", "--port", str(taken_port)), address, "choose another --port")
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text("tokens:\n  - {token: dev-secret-1, user: a, tenant: t, roles: [operator]}\n")
    refused(
        airt(tmp_path, "control-plane", "--port", str(taken_port), "--tokens-file", str(tokens)),
        address,
    )
    assert not (tmp_path / "up.json").exists()
    runtime = airt(tmp_path, "runtime", "--http-host", "127.0.0.1", "--http-port", str(taken_port))
    refused(runtime, address, "choose another --http-port")


def test_a_second_stack_in_the_same_home_is_refused_and_the_first_keeps_its_state(
    tmp_path: Path, taken_port: int
) -> None:
    state = tmp_path / "up.json"
    first = {"tokens": {"default": "dev-x"}, "api_url": "http://127.0.0.1:1", "pid": os.getpid()}
    state.write_text(json.dumps(first))
    flat = refused(airt(tmp_path, "up", "--port", "0"), f"already running here (pid {os.getpid()}")
    assert str(state) in flat and HOME_ENV in flat, flat
    assert json.loads(state.read_text()) == first


def test_a_state_file_left_by_a_process_that_is_gone_does_not_count(
    tmp_path: Path, taken_port: int
) -> None:
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    (tmp_path / "up.json").write_text(json.dumps({"pid": int(gone.stdout), "api_url": "x"}))
    # Past the state file, the next check is the port's: the stale file was not a stack.
    refused(airt(tmp_path, "up", "--port", str(taken_port)), "Address already in use")


def test_a_home_that_is_not_a_directory_is_refused_naming_it(tmp_path: Path) -> None:
    """``AIRUNTIME_HOME`` naming a file: ``airt up`` printed its banner (Valkey started)
    then a traceback from the history's SQLite file; ``airt control-plane`` a traceback;
    ``airt submit`` a ``NotADirectoryError`` traceback reading the state file."""
    home = tmp_path / "home"
    home.write_text("not a directory\n")
    refused(
        airt(home, "up", "--port", "0"),
        f"AIRUNTIME_HOME={home}: cannot be used as a directory: it is a file",
    )
    refused(
        airt(home / "sub", "up", "--port", "0"),
        f"AIRUNTIME_HOME={home / 'sub'}: cannot be used as a directory: Not a directory",
    )
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text("tokens:\n  - {token: dev-secret-1, user: a, tenant: t, roles: [operator]}\n")
    refused(
        airt(home, "control-plane", "--port", "0", "--tokens-file", str(tokens)),
        f"history sqlite:///{home / 'history.db'}:",
        "AIRUNTIME_HISTORY_DSN",
    )
    mcp = airt(home, "mcp", "--local-admin", "--tenant", "default")
    refused(mcp, f"history sqlite:///{home / 'history.db'}:", "AIRUNTIME_HOME")
    refused(
        airt(home, "submit", "summarize-documents"),
        f"cannot read the local stack's state {home / 'up.json'}: Not a directory",
    )
    assert home.read_text() == "not a directory\n"


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        pytest.param(
            "AIRUNTIME_MODEL_PROVIDERS",
            '{"openai": {"base_url": "https://api.openai.com/v1", "api_key": "sk-inline-1"}}',
            "AIRUNTIME_MODEL_PROVIDERS: provider 'openai': api_key: Extra inputs are not permitted",
            id="model-providers",
        ),
        pytest.param(
            "AIRUNTIME_HTTP_HANDLER_ALLOW",
            "not a host!",
            "AIRUNTIME_HTTP_HANDLER_ALLOW: 'not a host!' is neither a network",
            id="http-allow",
        ),
        pytest.param(
            "AIRUNTIME_PYTHON_HANDLER_MODULES",
            "os",
            "AIRUNTIME_PYTHON_HANDLER_MODULES: 'os' may never be opened",
            id="python-modules",
        ),
        pytest.param(
            "AIRUNTIME_SECRETS_KEYS",
            "sk-inline-1",
            "AIRUNTIME_SECRETS_KEYS: key 1 has 11 characters, fewer than 32",
            id="secrets-keys",
        ),
    ],
)
def test_a_malformed_handler_policy_is_refused_before_anything_starts(
    tmp_path: Path, variable: str, value: str, expected: str
) -> None:
    """The platform's handler policy is read by every process that compiles or runs
    pipelines: malformed, each refuses to start naming the variable (it used to be a
    traceback from ``airt run`` and a 500 for every submit); the providers' JSON, which
    may hold what should have been a key, is not echoed."""
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text("tokens:\n  - {token: dev-secret-1, user: a, tenant: t, roles: [operator]}\n")
    commands = [
        ("up", "--port", "0"),
        ("control-plane", "--port", "0", "--tokens-file", str(tokens)),
        ("runtime", "--http-host", "127.0.0.1", "--http-port", "0"),
        ("worker", "ex-1"),
        ("run", "retries"),
    ]
    for command in commands:
        flat = refused(airt(tmp_path, *command, **{variable: value}), expected)
        assert "sk-inline-1" not in flat, command
    assert not (tmp_path / "up.json").exists()
