"""The version is written once, in pyproject.toml; what must carry it as a literal
(the Helm chart) is checked against it, and the image takes it as a build argument."""

from __future__ import annotations

import re
import tomllib
from importlib.metadata import version
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def _project_version() -> str:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return str(data["project"]["version"])


def test_the_installed_package_is_the_project_version() -> None:
    assert version("airuntime") == _project_version()


def test_the_helm_chart_versions_equal_the_package_version() -> None:
    chart = yaml.safe_load((ROOT / "helm" / "airuntime" / "Chart.yaml").read_text())
    assert str(chart["version"]) == _project_version()
    assert str(chart["appVersion"]) == _project_version()


def test_the_image_label_takes_the_version_from_a_build_argument() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert 'org.opencontainers.image.version="${AIRUNTIME_VERSION}"' in dockerfile
    assert not re.search(re.escape(_project_version()), dockerfile)
