"""The log of airuntime's long-running processes (:mod:`airuntime.core.log_output`).

A real ``airt up`` (embedded Valkey, control plane with its MCP endpoint, the local
scaler starting a runtime process) writes its records one a line: JSON objects with
``AIRUNTIME_LOG_FORMAT=json``, ``<UTC time> <LEVEL> <logger>: <message>`` by default;
before, they went through Python's last-resort handler (the bare message, no INFO) or,
once the MCP SDK had called ``basicConfig``, rich's 80-column layout, one record over
several lines. A malformed ``AIRUNTIME_LOG_*`` is refused by every long-running command
before it starts anything.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from airuntime.core.log_output import LogFormat, LogSettings, configure_logs
from airuntime.core.settings import HOME_ENV, REDIS_URL_ENV
from tests.polling import wait_until

TEXT_LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (DEBUG|INFO|WARNING|ERROR) \S+: ")


def _env(home: Path, **extra: str) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("AIRUNTIME_")}
    return {**clean, "COLUMNS": "80", HOME_ENV: str(home), **extra}


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        ("AIRUNTIME_LOG_LEVEL", "loud", "AIRUNTIME_LOG_LEVEL: Input should be 'DEBUG', 'INFO', "
         "'WARNING', 'ERROR' or 'CRITICAL' (value='loud')"),
        ("AIRUNTIME_LOG_FORMAT", "xml", "AIRUNTIME_LOG_FORMAT: Input should be 'text' or 'json' "
         "(value='xml')"),
    ],
)  # fmt: skip
def test_a_malformed_log_setting_is_refused_before_anything_starts(
    tmp_path: Path, variable: str, value: str, expected: str
) -> None:
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text("tokens:\n  - {token: dev-secret-1, user: a, tenant: t, roles: [operator]}\n")
    commands = {
        "up": ["up", "--port", "0"],
        "control-plane": ["control-plane", "--port", "0", "--tokens-file", str(tokens)],
        "runtime": ["runtime", "--provider", "local"],
        "worker": ["worker", "ex-1"],
    }
    for name, args in commands.items():
        env = _env(tmp_path, **{variable: value, REDIS_URL_ENV: "redis://127.0.0.1:1/0"})
        result = subprocess.run(
            [sys.executable, "-m", "airuntime.cli", *args],
            env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        shown = result.stdout + result.stderr
        assert result.returncode == 2, (name, shown)
        assert expected in " ".join(result.stderr.split()), (name, shown)
        assert "Traceback" not in shown and "airt up: Redis at" not in shown, (name, shown)


@pytest.fixture
def stack_log(tmp_path: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    """Where a started ``airt up`` writes its stderr, and its environment."""
    yield tmp_path / "up.log", _env(tmp_path / "home")


def _run_up_and_submit(log: Path, env: dict[str, str]) -> str:
    """Start ``airt up`` (stderr to ``log``), submit a run, stop it with SIGINT; the log."""
    home = Path(env[HOME_ENV])
    with log.open("w") as sink:
        up = subprocess.Popen(
            [sys.executable, "-m", "airuntime.cli", "up", "--port", "0"],
            env=env, stdout=sink, stderr=sink,
        )  # fmt: skip
        try:
            wait_until(lambda: (home / "up.json").exists(), within=60, what="airt up's state")
            submitted = subprocess.run(
                [sys.executable, "-m", "airuntime.cli", "submit", "summarize-documents", "--wait"],
                env=env, capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            assert submitted.returncode == 0, submitted.stdout + submitted.stderr
        finally:
            up.send_signal(signal.SIGINT)
            assert up.wait(timeout=60) == 0, log.read_text()
    return log.read_text()


def test_a_stack_logs_one_json_object_a_record_even_with_the_mcp_sdk_loaded(
    stack_log: tuple[Path, dict[str, str]],
) -> None:
    log, env = stack_log
    text = _run_up_and_submit(log, {**env, "AIRUNTIME_LOG_FORMAT": "json"})
    lines = [line for line in text.splitlines() if not line.startswith("airt up: Redis at")]
    records = [json.loads(line) for line in lines]  # every other line is one record
    assert all(set(r) >= {"ts", "level", "logger", "message"} for r in records), records
    loggers = {r["logger"] for r in records}
    assert "airuntime.devstack.embedded" in loggers, loggers  # INFO is written
    started = [r for r in records if r["logger"] == "airuntime.control_plane.scale_out.local"]
    assert started and started[0]["level"] == "INFO", records
    assert "local scaler started runtime-instance-1" in started[0]["message"], started


def test_a_stack_logs_a_line_a_record_with_time_level_and_logger_by_default(
    stack_log: tuple[Path, dict[str, str]],
) -> None:
    log, env = stack_log
    text = _run_up_and_submit(log, env)
    lines = [line for line in text.splitlines() if not line.startswith("airt up: Redis at")]
    assert lines and all(TEXT_LINE.match(line) for line in lines), text
    assert any("local scaler started runtime-instance-1" in line for line in lines), text


@pytest.fixture
def root_logger() -> Iterator[logging.Logger]:
    """The root logger, its handlers and level put back afterwards (pytest's own too)."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield root
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)


@pytest.mark.parametrize("fmt", list(LogFormat))
def test_a_record_with_a_traceback_and_a_later_basic_config(
    root_logger: logging.Logger, fmt: LogFormat
) -> None:
    stream = io.StringIO()
    handler = configure_logs(LogSettings(log_format=fmt, log_level="info").log_level, fmt, stream)
    logging.basicConfig(level=logging.DEBUG, handlers=[logging.StreamHandler(io.StringIO())])
    assert root_logger.handlers == [handler]  # what the MCP SDK does changed nothing
    log = logging.getLogger("airuntime.test")
    try:
        1 / 0  # noqa: B018
    except ZeroDivisionError:
        log.exception("loop %s failed", "pump")
    log.debug("not written at INFO")
    logging.getLogger("httpx").info("HTTP Request: POST ... (per request: held back)")
    written = stream.getvalue().splitlines()
    if fmt is LogFormat.JSON:
        [record] = [json.loads(line) for line in written]
        assert record["message"] == "loop pump failed" and record["level"] == "ERROR"
        assert record["logger"] == "airuntime.test"
        assert (
            record["exception"].startswith("Traceback")
            and "ZeroDivisionError" in record["exception"]
        )
    else:
        assert TEXT_LINE.match(written[0]) and written[0].endswith(
            "ERROR airuntime.test: loop pump failed"
        ), written
        assert (
            written[1] == "Traceback (most recent call last):"
            and "ZeroDivisionError" in (written[-1])
        ), written
