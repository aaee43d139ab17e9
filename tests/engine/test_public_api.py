"""The curated public API of ``import airuntime``: what it exports, and that importing it
stays cheap."""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import subprocess
import sys

import pytest

import airuntime
from airuntime.core.version import installed_version

PUBLIC = [
    "AirError",
    "HandlerError",
    "Pipeline",
    "PipelineError",
    "StepCancelled",
    "StepContext",
    "StepFailed",
    "TransientError",
    "__version__",
    "handler",
]


def test_all_is_pinned() -> None:
    assert airuntime.__all__ == PUBLIC


@pytest.mark.parametrize(
    ("name", "home"),
    [
        ("AirError", "airuntime.core.errors"),
        ("HandlerError", "airuntime.engine.handlers"),
        ("Pipeline", "airuntime.engine.pipeline"),
        ("PipelineError", "airuntime.engine.pipeline"),
        ("StepCancelled", "airuntime.engine.handlers"),
        ("StepContext", "airuntime.engine.handlers"),
        ("StepFailed", "airuntime.engine.handlers"),
        ("TransientError", "airuntime.engine.handlers"),
        ("handler", "airuntime.engine.handlers"),
    ],
)
def test_each_name_is_the_object_of_its_home_module(name: str, home: str) -> None:
    assert getattr(airuntime, name) is getattr(importlib.import_module(home), name)


def test_errors_are_one_tree() -> None:
    assert issubclass(airuntime.PipelineError, airuntime.AirError)
    assert issubclass(airuntime.PipelineError, ValueError)


def test_the_version_is_the_installed_distributions() -> None:
    assert airuntime.__version__ == importlib.metadata.version("airuntime")


def test_the_version_without_installed_metadata(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    installed_version.cache_clear()
    try:
        assert installed_version() == "0+unknown"
    finally:
        installed_version.cache_clear()


def test_unknown_names_are_attribute_errors() -> None:
    with pytest.raises(AttributeError, match="nope"):
        _ = airuntime.nope  # type: ignore[attr-defined]


def test_importing_airuntime_loads_nothing_else() -> None:
    code = "import sys, json, airuntime; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(json.loads(out.stdout))
    ours = {m for m in loaded if m.startswith("airuntime.")}
    heavy = {"fastapi", "uvicorn", "pydantic", "redis", "yaml"} & loaded
    assert not ours and not heavy, (ours, heavy)
