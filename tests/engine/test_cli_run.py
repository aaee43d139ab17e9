"""``airt run``: exit codes, the terminal snapshot, and bad input rejected before Redis."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis as sync_redis

from airuntime.core import keys
from airuntime.devstack.cluster import LocalCluster
from tests.conftest import RedisServerInfo
from tests.echo_service import echo_service

EXAMPLES = Path(__file__).resolve().parents[2] / "airuntime" / "examples"


def airt(
    *args: str,
    redis_url: str | None,
    stdin: str | None = None,
    extra_env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("AIRUNTIME_REDIS_URL", "AIRUNTIME_REDIS_CLUSTER")
    }
    env.update(extra_env or {})
    if redis_url:
        env["AIRUNTIME_REDIS_URL"] = redis_url
    return subprocess.run(
        [sys.executable, "-m", "airuntime.cli", *args],
        env=env,
        input=stdin or "",
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    "example",
    [
        pytest.param("summarize-documents.yaml", id="fan-out/fan-in"),
        pytest.param("retries.yaml", id="retries"),
        pytest.param("throttled-provider.yaml", id="throttled provider"),
    ],
)
def test_examples_succeed_on_the_embedded_default(example: str) -> None:
    result = airt("run", str(EXAMPLES / example), "--json", redis_url=None)
    assert result.returncode == 0, result.stderr
    snapshot = json.loads(result.stdout)
    assert snapshot["status"] == "Succeeded"
    assert snapshot["counts"]["completed"] == snapshot["counts"]["total"]


@pytest.mark.parametrize("form", ["redis+cluster URL", "AIRUNTIME_REDIS_CLUSTER=1"])
def test_an_example_runs_on_a_valkey_cluster(valkey_cluster: LocalCluster, form: str) -> None:
    """The fan-out/fan-in example end to end on the 3-shard cluster, reached either way
    a deployment may name it; its keys land in the execution's bucket on one primary."""
    if form == "redis+cluster URL":
        result = airt(
            "run",
            str(EXAMPLES / "summarize-documents.yaml"),
            "--json",
            redis_url=valkey_cluster.url,
        )
    else:
        one_node = f"redis://127.0.0.1:{valkey_cluster.masters()[0]}"
        result = airt(
            "run",
            str(EXAMPLES / "summarize-documents.yaml"),
            "--json",
            redis_url=one_node,
            extra_env={"AIRUNTIME_REDIS_CLUSTER": "1"},
        )
    assert result.returncode == 0, result.stderr
    snapshot = json.loads(result.stdout)
    assert snapshot["status"] == "Succeeded"
    assert snapshot["counts"]["completed"] == snapshot["counts"]["total"] > 1
    meta = keys.execution_keys(snapshot["execution_id"], keys.CLUSTER_EXECUTION_BUCKETS).meta
    client = sync_redis.RedisCluster(host="127.0.0.1", port=valkey_cluster.masters()[0])
    try:
        assert client.hget(meta, "terminal") == b"Succeeded"
    finally:
        client.close()


def test_input_step_is_answered_from_the_command_line(valkey_url: str) -> None:
    result = airt(
        "run",
        str(EXAMPLES / "human-input.yaml"),
        "--json",
        "--answer",
        'approve="ship it"',
        redis_url=valkey_url,
    )
    assert result.returncode == 0, result.stderr
    snapshot = json.loads(result.stdout)
    assert snapshot["steps"]["approve"]["output"] == "ship it"


def test_unanswered_input_without_a_terminal_cancels_and_exits_1(valkey_url: str) -> None:
    result = airt("run", str(EXAMPLES / "human-input.yaml"), "--json", redis_url=valkey_url)
    assert result.returncode == 1
    assert json.loads(result.stdout)["status"] == "Cancelled"
    assert "--answer approve=VALUE" in result.stderr


def test_a_failed_execution_exits_1(tmp_path: Path, valkey_url: str) -> None:
    path = tmp_path / "fails.yaml"
    path.write_text("id: fails\nsteps:\n  - id: a\n    uses: fail\n    with: {fail_attempts: 5}\n")
    result = airt("run", str(path), "--json", redis_url=valkey_url)
    assert result.returncode == 1
    assert json.loads(result.stdout)["steps"]["a"]["status"] == "failed"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param(
            "id: x\nsteps:\n  - {id: a, uses: nope}\n",
            "steps[0].uses: unknown handler 'nope'",
            id="unknown handler",
        ),
        pytest.param(
            "id: x\nsteps:\n  - {id: a, uses: noop, depends_on: [b]}\n"
            "  - {id: b, uses: noop, depends_on: [a]}\n",
            "dependency cycle",
            id="cycle",
        ),
        pytest.param(
            "id: x\nsteps:\n  - {id: a, uses: noop, depends_on: [zz]}\n",
            "unknown step 'zz'",
            id="unknown dep",
        ),
        pytest.param("id: x\nsteps: []\n", "steps", id="no steps"),
    ],
)
def test_invalid_pipelines_exit_2_and_write_nothing(
    tmp_path: Path, valkey_url: str, text: str, message: str
) -> None:
    client = sync_redis.Redis.from_url(valkey_url)
    client.flushall()
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    result = airt("run", str(path), redis_url=valkey_url)
    assert result.returncode == 2
    assert message in result.stderr
    assert client.dbsize() == 0, "nothing may be written for an invalid pipeline"
    client.close()


def test_bad_options_exit_2(valkey_url: str) -> None:
    result = airt("run", str(EXAMPLES / "retries.yaml"), "--workers", "0", redis_url=valkey_url)
    assert result.returncode == 2 and "--workers: must be >= 1, got 0" in result.stderr
    result = airt("run", str(EXAMPLES / "nope.yaml"), redis_url=valkey_url)
    assert result.returncode == 2 and "nope.yaml" in result.stderr


def test_airt_run_takes_secrets_from_the_environment_and_stores_none(
    tmp_path: Path, redis_server: RedisServerInfo
) -> None:
    """``--secret NAME`` hands the variable NAME's value to the run's http headers; the
    output shows ``***`` where a service echoed it, and Redis holds it nowhere."""
    value = "run-secret-value-0123456789"
    pipeline = tmp_path / "secret.yaml"
    pipeline.write_text(
        "id: with-secret\n"
        "steps:\n"
        "  - id: call\n"
        "    uses: http\n"
        "    with:\n"
        "      url: ${inputs.base}/headers\n"
        '      headers: {Authorization: "Bearer ${secrets.API_TOKEN}"}\n'
    )
    env = {"AIRUNTIME_HTTP_HANDLER_ALLOW": "127.0.0.1/32", "API_TOKEN": value}
    with echo_service() as echo:
        base = f"base={echo.base}"
        result = airt(
            "run", str(pipeline), "--secret", "API_TOKEN", "--json", "-i", base,
            redis_url=redis_server.url, extra_env=env,
        )  # fmt: skip
        missing = airt(
            "run", str(pipeline), "--secret", "NOT_SET_HERE", "-i", base,
            redis_url=redis_server.url, extra_env=env,
        )  # fmt: skip
    assert result.returncode == 0, result.stderr
    snapshot = json.loads(result.stdout)
    output = snapshot["steps"]["call"]["output"]
    assert output == {"status": 200, "json": {"authorization": "Bearer ***"}}
    assert echo.seen == [f"Bearer {value}"]
    client = sync_redis.Redis.from_url(redis_server.url)
    try:
        for key in client.scan_iter(count=1000):
            kind = client.type(key).decode()
            content = client.get(key) if kind == "string" else b""
            if kind == "hash":
                content = b"".join(k + v for k, v in client.hgetall(key).items())
            assert value.encode() not in (content or b""), key
    finally:
        client.close()
    assert missing.returncode == 2 and "--secret: NOT_SET_HERE is not set" in missing.stderr
