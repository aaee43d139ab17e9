"""How ``airt runtime`` and ``airt control-plane`` read their settings: an option that
is given wins over its ``AIRUNTIME_*`` variable, which wins over the default; an
invalid value, from either, exits 2 naming where it came from and the value.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from pydantic import ValidationError

from airuntime.control_plane.settings import (
    ControlPlaneServerSettings,
    ControlPlaneSettings,
    ScaleOutProviderKind,
    SubmitMode,
)
from airuntime.core.settings import REDIS_URL_ENV
from airuntime.fleet.instance_settings import InstanceSettings
from airuntime.fleet.tenancy import IsolationMode
from airuntime.k8s.v1alpha1 import OPERATOR_MANAGED_ENV

UNREACHABLE = "redis://127.0.0.1:1/0"
"""Never contacted: every command below stops before it connects."""


def airt(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("AIRUNTIME_")}
    return subprocess.run(
        [sys.executable, "-m", "airuntime.cli", *args],
        env={**clean, "COLUMNS": "200", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def refused(result: subprocess.CompletedProcess[str], *expected: str) -> None:
    assert result.returncode == 2, result.stdout + result.stderr
    flat = " ".join(result.stderr.split())
    for text in expected:
        assert text in flat, flat
    assert "Traceback" not in result.stderr + result.stdout


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in list(os.environ):
        if name.startswith("AIRUNTIME_"):
            monkeypatch.delenv(name)
    return monkeypatch


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        pytest.param(
            ["runtime"],
            {"AIRUNTIME_WORKERS": "many"},
            ["AIRUNTIME_WORKERS", "valid integer", "'many'"],
            id="runtime-int",
        ),
        pytest.param(
            ["runtime"],
            {"AIRUNTIME_ISOLATION_MODE": "Private"},
            ["AIRUNTIME_ISOLATION_MODE", "'Private'"],
            id="runtime-enum",
        ),
        pytest.param(
            ["runtime"],
            {"AIRUNTIME_TENANT_ID": "Team_X"},
            ["AIRUNTIME_TENANT_ID", "'Team_X'"],
            id="runtime-pattern",
        ),
        pytest.param(
            ["runtime"],
            {"AIRUNTIME_PREFER_DEDICATED": "perhaps"},
            ["AIRUNTIME_PREFER_DEDICATED", "valid boolean", "'perhaps'"],
            id="runtime-bool",
        ),
        pytest.param(
            ["control-plane"],
            {"AIRUNTIME_SCALE_OUT_PROVIDER": "k8s"},
            ["AIRUNTIME_SCALE_OUT_PROVIDER", "'local', 'kubernetes' or 'none'", "'k8s'"],
            id="control-plane-provider",
        ),
        pytest.param(
            ["control-plane"],
            {"AIRUNTIME_API_PORT": "http"},
            ["AIRUNTIME_API_PORT", "'http'"],
            id="control-plane-port",
        ),
        pytest.param(
            ["runtime"],
            {"AIRUNTIME_GC_GEN0_THRESHOLD": "lots"},
            ["AIRUNTIME_GC_GEN0_THRESHOLD", "'lots'"],
            id="runtime-gc",
        ),
        pytest.param(
            ["control-plane"],
            {"AIRUNTIME_GC_GEN0_THRESHOLD": "-5"},
            ["AIRUNTIME_GC_GEN0_THRESHOLD", "'-5'"],
            id="control-plane-gc",
        ),
        pytest.param(
            ["up"],
            {"AIRUNTIME_GC_GEN0_THRESHOLD": "1e9"},
            ["AIRUNTIME_GC_GEN0_THRESHOLD", "'1e9'"],
            id="up-gc",
        ),
    ],
)
def test_an_invalid_variable_exits_2_naming_the_variable_and_the_value(
    args: list[str], env: dict[str, str], expected: list[str]
) -> None:
    refused(airt(*args, **{REDIS_URL_ENV: UNREACHABLE, **env}), *expected)


def test_airt_up_refuses_a_malformed_collector_setting_before_starting_anything() -> None:
    result = airt("up", **{REDIS_URL_ENV: UNREACHABLE, "AIRUNTIME_GC_GEN0_THRESHOLD": "many"})
    refused(result, "AIRUNTIME_GC_GEN0_THRESHOLD", "'many'")
    assert "airt up: Redis at" not in result.stdout + result.stderr, "refused before starting"


def test_an_invalid_option_exits_2_naming_the_option_and_the_value() -> None:
    refused(airt("runtime", "--workers", "0", **{REDIS_URL_ENV: UNREACHABLE}), "--workers:")
    refused(airt("runtime", "--lease-ms", "5", **{REDIS_URL_ENV: UNREACHABLE}), "(value=5)")
    refused(airt("control-plane", "--port", "70000", **{REDIS_URL_ENV: UNREACHABLE}), "--port:")
    refused(airt("control-plane", "--scale-out-provider", "k8s"), "--scale-out-provider")


def test_an_option_overrides_its_variable() -> None:
    # The variable alone is refused; with the option given it is never read, and the
    # command gets as far as its next requirement.
    refused(airt("runtime", AIRUNTIME_WORKERS="many"), "AIRUNTIME_WORKERS")
    refused(
        airt("runtime", "--workers", "3", AIRUNTIME_WORKERS="many"),
        f"needs the shared Redis of the control plane: set {REDIS_URL_ENV}",
    )
    refused(
        airt("control-plane", "--scale-out-provider", "none", AIRUNTIME_SCALE_OUT_PROVIDER="k8s"),
        f"needs a shared Redis: set {REDIS_URL_ENV}",
    )


def test_a_rule_across_settings_names_them_without_echoing_the_redis_url() -> None:
    secret = "redis://:s3cret@127.0.0.1:1/0"
    result = airt("runtime", AIRUNTIME_ISOLATION_MODE="Dedicated", **{REDIS_URL_ENV: secret})
    refused(result, "isolation_mode Dedicated needs tenant_id or tenant_group_id")
    assert "s3cret" not in result.stderr


def test_runtime_settings_keep_their_defaults_and_variables(clean_env: pytest.MonkeyPatch) -> None:
    settings = InstanceSettings()
    assert settings.model_dump() == {
        "tenant_id": None,
        "tenant_group_id": None,
        "isolation_mode": IsolationMode.SHARED,
        "prefer_dedicated": False,
        "allow_shared_fallback": True,
        "runtime_prefix": "runtime-instance",
        "instance_id": None,
        "workers": 10,
        "max_concurrent_runs": 3,
        "queue_capacity": 100,
        "max_local_workers_per_execution": 4,
        "max_concurrent_step_tasks": 0,
        "step_slots_from_tenant": False,
        "provider": "redis",
        "heartbeat_s": 2.0,
        "lease_ms": 15_000,
        "run_retention_s": 7 * 24 * 3600,
        "archive": True,
        "archive_hold_s": None,
        "redis_url": None,
        "http_host": "127.0.0.1",
        "http_port": 0,
        "advertise_host": None,
        "wait_for_control_plane_s": 0.0,
        "settings_file": None,
        "runtime_token": None,
    }
    assert InstanceSettings.env_var("runtime_token") == "AIRUNTIME_RUNTIME_TOKEN"
    assert InstanceSettings.env_var("max_local_workers_per_execution") == (
        "AIRUNTIME_MAX_LOCAL_WORKERS_PER_EXECUTION"
    )
    assert set(OPERATOR_MANAGED_ENV) <= {
        InstanceSettings.env_var(f) for f in InstanceSettings.model_fields
    }


def test_runtime_settings_option_over_variable_over_default(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("AIRUNTIME_WORKERS", "7")
    clean_env.setenv("AIRUNTIME_TENANT_ID", "team-x")
    clean_env.setenv("AIRUNTIME_TENANT_GROUP_ID", "")  # the operator's "no group"
    clean_env.setenv("AIRUNTIME_ALLOW_SHARED_FALLBACK", "false")
    from_env = InstanceSettings()
    assert (from_env.workers, from_env.tenant_id, from_env.tenant_group_id) == (7, "team-x", None)
    given = InstanceSettings(workers=3, tenant_id="")  # `--tenant ""`: no tenant
    assert (given.workers, given.tenant_id, given.allow_shared_fallback) == (3, None, False)
    config = from_env.instance_config()
    assert (config.workers, config.tenant_id, config.allow_shared_fallback) == (7, "team-x", False)
    assert config.assist, "assist is not a variable: the instance default holds"


def test_control_plane_settings_from_the_environment_only_for_the_server(
    clean_env: pytest.MonkeyPatch,
) -> None:
    defaults = ControlPlaneServerSettings()
    assert (defaults.api_host, defaults.api_port, defaults.scale_out_provider) == (
        "127.0.0.1",
        8780,
        ScaleOutProviderKind.LOCAL,
    )
    assert (defaults.submit_mode, defaults.pump_enabled, defaults.background_pump) == (
        SubmitMode.QUEUE_FIRST,
        True,
        True,
    )
    clean_env.setenv("AIRUNTIME_SUBMIT_MODE", "DirectDispatch")
    clean_env.setenv("AIRUNTIME_BACKGROUND_PUMP", "0")
    server = ControlPlaneServerSettings(scale_out_enabled=False).control_plane_settings()
    assert (server.submit_mode, server.background_pump, server.scale_out_enabled) == (
        SubmitMode.DIRECT_DISPATCH,
        False,
        False,
    )
    clean_env.setenv("AIRUNTIME_CLAIM_LEASE_MS", "8000")
    assert ControlPlaneServerSettings().control_plane_settings().claim_lease_ms == 8000
    clean_env.setenv("AIRUNTIME_CLAIM_LEASE_MS", "5")
    with pytest.raises(ValidationError, match="claim_lease_ms"):
        ControlPlaneServerSettings()
    clean_env.delenv("AIRUNTIME_CLAIM_LEASE_MS")
    # A control plane built in code (airt up, tests) reads no environment.
    built = ControlPlaneSettings(background_pump=False)
    assert built.submit_mode is SubmitMode.QUEUE_FIRST and built.pump_enabled


@pytest.mark.parametrize(
    ("url", "code", "says"),
    [
        pytest.param("bogus://x", 2, "invalid Redis URL 'bogus://x'", id="scheme"),
        pytest.param(
            "redis+cluster://user:s3cret@nohostport",
            2,
            "seed 'nohostport' is not host:port (in 'redis+cluster://user:***@nohostport')",
            id="cluster-seed",
        ),
        pytest.param("redis://:s3cret@127.0.0.1:1/0", 1, "cannot reach Redis", id="down"),
        pytest.param("redis+cluster://127.0.0.1:1", 1, "cannot reach Redis", id="cluster-down"),
    ],
)
def test_a_redis_url_that_cannot_be_used_is_one_error_line_not_a_traceback(
    url: str, code: int, says: str
) -> None:
    ran = airt("run", "retries", "--json", **{REDIS_URL_ENV: url})
    assert ran.returncode == code, ran.stderr
    assert says in ran.stderr and "Traceback" not in ran.stderr, ran.stderr
    assert "s3cret" not in ran.stderr + ran.stdout
