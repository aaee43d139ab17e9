"""Every published Kubernetes example is a valid resource for the real API server."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from kubernetes import client

from airuntime.k8s.v1alpha1 import RuntimePoolSpec

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples" / "kubernetes").glob("*.yaml"))


@pytest.mark.parametrize("path", [pytest.param(p, id=p.name) for p in EXAMPLES])
def test_example_is_accepted_by_the_api_server(
    path: Path, k8s: client.ApiClient, namespace: str
) -> None:
    doc = yaml.safe_load(path.read_text())
    assert doc["kind"] == "RuntimePool"
    RuntimePoolSpec.model_validate(doc["spec"])
    custom = client.CustomObjectsApi(k8s)
    created = custom.create_namespaced_custom_object(
        "airuntime.io", "v1alpha1", namespace, "runtimepools", doc, dry_run="All"
    )
    assert created["spec"]["runtimePrefix"] == doc["spec"]["runtimePrefix"]


def test_there_is_an_example_per_isolation_mode() -> None:
    modes = {yaml.safe_load(p.read_text())["spec"]["isolationMode"] for p in EXAMPLES}
    assert modes == {"Shared", "Dedicated", "Hybrid"}
