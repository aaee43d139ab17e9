"""The operator package's edges: public surface, import direction, settings from env."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

import airuntime_operator
from airuntime_operator import OperatorSettings, SettingsError
from tests.k8s_env import REPO_ROOT


def test_public_surface_is_pinned() -> None:
    assert sorted(airuntime_operator.__all__) == [
        "FINALIZER", "OperatorSettings", "SettingsError", "build_registry", "run",
    ]  # fmt: skip


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.parametrize(
    ("folder", "forbidden"),
    [
        pytest.param("operator", ("runtime_pod",), id="operator-never-imports-runtime-pod"),
        pytest.param("airuntime", ("airuntime_operator", "runtime_pod"), id="core-imports-neither"),
    ],
)
def test_import_direction(folder: str, forbidden: tuple[str, ...]) -> None:
    offenders = {
        f"{path.relative_to(REPO_ROOT)} imports {name}"
        for path in (REPO_ROOT / folder).rglob("*.py")
        for name in _imported_modules(path)
        if name.split(".")[0] in forbidden
    }
    assert not offenders


def test_only_the_shared_client_imports_the_kubernetes_client() -> None:
    importers = sorted(
        str(path.relative_to(REPO_ROOT))
        for folder in ("airuntime", "operator")
        for path in (REPO_ROOT / folder).rglob("*.py")
        if any(name.split(".")[0] == "kubernetes" for name in _imported_modules(path))
    )
    assert importers == ["airuntime/k8s/client.py"]


def test_settings_from_env() -> None:
    settings = OperatorSettings.from_env(
        {
            "AIRUNTIME_REDIS_URL": "redis://redis:6379/0",
            "AIRUNTIME_OPERATOR_NAMESPACES": "tenants-a, tenants-b",
            "AIRUNTIME_OPERATOR_RETENTION": "120",
            "AIRUNTIME_OPERATOR_STANDALONE": "true",
            "AIRUNTIME_OPERATOR_PRIORITY": "7",
        }
    )

    assert settings.namespaces == ("tenants-a", "tenants-b")
    assert not settings.clusterwide
    assert settings.retention_seconds == 120.0
    assert settings.standalone
    assert settings.priority == 7
    assert settings.peering_name == "airuntime"
    assert settings.kubeconfig is None


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        pytest.param({}, "AIRUNTIME_REDIS_URL", id="missing-redis-url"),
        pytest.param(
            {"AIRUNTIME_REDIS_URL": "redis://r", "AIRUNTIME_OPERATOR_RETENTION": "soon"},
            "AIRUNTIME_OPERATOR_RETENTION must be a number",
            id="retention-not-a-number",
        ),
        pytest.param(
            {"AIRUNTIME_REDIS_URL": "redis://r", "AIRUNTIME_OPERATOR_GC_INTERVAL": "0"},
            "gc_interval_seconds must be positive",
            id="gc-interval-zero",
        ),
        pytest.param(
            {"AIRUNTIME_REDIS_URL": "redis://r", "AIRUNTIME_PYTHON_HANDLER_MODULES": "os"},
            "AIRUNTIME_PYTHON_HANDLER_MODULES='os': 'os' may never be opened",
            id="python-modules-os",
        ),
        pytest.param(
            {"AIRUNTIME_REDIS_URL": "redis://r", "AIRUNTIME_HTTP_HANDLER_DENY_CIDRS": "x/99"},
            "AIRUNTIME_HTTP_HANDLER_DENY_CIDRS='x/99'",
            id="deny-cidrs-malformed",
        ),
        pytest.param(  # the providers' JSON is not echoed: provider and field are named
            {
                "AIRUNTIME_REDIS_URL": "redis://r",
                "AIRUNTIME_MODEL_PROVIDERS": '{"gpt": {"base_url": "x", "api_key_env": "K"}}',
            },
            "^AIRUNTIME_MODEL_PROVIDERS: provider 'gpt': base_url: 'x' must be an http",
            id="model-providers",
        ),
        pytest.param(
            {"AIRUNTIME_REDIS_URL": "redis://r", "AIRUNTIME_LOG_FORMAT": "xml"},
            "AIRUNTIME_LOG_FORMAT='xml'",
            id="log-format",
        ),
        pytest.param(  # every process's level, the operator's too: named as it was set
            {"AIRUNTIME_REDIS_URL": "redis://r", "AIRUNTIME_LOG_LEVEL": "loud"},
            "^AIRUNTIME_LOG_LEVEL='loud': log_level must be one of",
            id="log-level",
        ),
    ],
)
def test_bad_settings_are_refused_with_the_name(environ: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        OperatorSettings.from_env(environ)


def test_every_setting_is_documented_with_its_variable() -> None:
    from airuntime_operator.settings import env_var

    for name, field in OperatorSettings.model_fields.items():
        assert field.description, f"{name} has no documentation"
        assert f"``{env_var(name)}" in field.description, f"{name} does not name its variable"


def test_settings_are_read_from_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRUNTIME_REDIS_URL", "redis://from-env:6379/0")
    monkeypatch.setenv("AIRUNTIME_OPERATOR_SCALE_IN", "0")
    monkeypatch.setenv("AIRUNTIME_OPERATOR_EXTRA_LABELS", "team=ml, cost-center=42")

    for settings in (OperatorSettings(), OperatorSettings.from_env()):
        assert settings.redis_url == "redis://from-env:6379/0"
        assert settings.scale_in is False
        assert settings.extra_labels == {"team": "ml", "cost-center": "42"}
    assert OperatorSettings(scale_in=True).scale_in is True  # arguments win


def test_default_runtime_image_is_the_installed_release() -> None:
    settings = OperatorSettings.from_env({"AIRUNTIME_REDIS_URL": "redis://r"})
    assert settings.runtime_image == f"ghcr.io/airuntime/airuntime:{version('airuntime')}"


def test_airt_operator_refuses_bad_settings_with_exit_2_naming_variable_and_value() -> None:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("AIRUNTIME_")},
        "AIRUNTIME_REDIS_URL": "redis://r",
        "AIRUNTIME_OPERATOR_RETENTION": "soon",
        "AIRUNTIME_OPERATOR_GC_INTERVAL": "-1",
    }
    result = subprocess.run(
        [sys.executable, "-m", "airuntime.cli", "operator"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "AIRUNTIME_OPERATOR_RETENTION must be a number, not 'soon'" in result.stderr
    assert "AIRUNTIME_OPERATOR_GC_INTERVAL='-1': gc_interval_seconds must be positive" in (
        result.stderr
    )
