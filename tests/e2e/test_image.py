"""The built image, run the way the chart runs it: uid 10001, read-only root, no capabilities.

The image is built from the repository's Dockerfile by ``scripts/image-build.sh``
(podman, daemonless; cached by content hash) and run with podman under the chart's
container security context (:data:`tests.e2e.cluster.HARDENED`): ``--read-only`` with a
``/tmp`` tmpfs (the chart's emptyDir), ``--cap-drop ALL``, ``no-new-privileges``,
``--user 10001:10001``, and no network. Skipped, with the reason, where podman is
missing and cannot be installed.
"""

from __future__ import annotations

import json

import pytest

from tests.e2e.cluster import BuiltImage, built_image, image_unavailable, podman_run

# A fresh machine debootstraps the base and builds the image first (about 5 minutes).
pytestmark = [pytest.mark.timeout(3600), pytest.mark.slow]

SIZE_CEILING_MB = 400
"""Not the goal (below 250 MB), a guard against a regression (see README, Images)."""


@pytest.fixture(scope="module")
def image() -> BuiltImage:
    reason = image_unavailable()
    if reason:
        pytest.skip(f"the image cannot be built here: {reason}")
    return built_image()


def _ok(proc: object) -> str:
    assert getattr(proc, "returncode", 1) == 0, (
        f"exit {getattr(proc, 'returncode', None)}:\n{getattr(proc, 'stdout', '')}\n"
        f"{getattr(proc, 'stderr', '')}"
    )
    return str(getattr(proc, "stdout", ""))


def test_airt_version_runs_as_uid_10001_on_a_read_only_root(image: BuiltImage) -> None:
    out = _ok(podman_run(image.ref, "--version"))
    assert out.strip() == "airt 0.1.0"
    ident = _ok(podman_run(image.ref, "-c", "import os; print(os.getuid(), os.getgid())",
                           entrypoint="python"))  # fmt: skip
    assert ident.split() == ["10001", "10001"]


def test_the_image_carries_exactly_the_repository_s_sources(image: BuiltImage) -> None:
    """Every Python file and Lua script of the packages, byte for byte: a build cache
    that reused a stale install layer (buildah keys bind mounts by name, not content)
    would ship yesterday's code under today's tag."""
    import hashlib

    from tests.e2e.cluster import REPO_ROOT

    roots = {"airuntime": "airuntime", "runtime_pod": "runtime_pod",
             "airuntime_operator": "operator/airuntime_operator"}  # fmt: skip
    expected = {
        f"{package}/{path.relative_to(REPO_ROOT / folder)}": hashlib.sha256(
            path.read_bytes()
        ).hexdigest()
        for package, folder in roots.items()
        for path in (REPO_ROOT / folder).rglob("*")
        if path.suffix in (".py", ".lua") and "__pycache__" not in path.parts
    }
    script = (
        "import hashlib, json, pathlib, sysconfig\n"
        "site = pathlib.Path(sysconfig.get_paths()['purelib'])\n"
        f"names = {sorted(roots)!r}\n"
        "print(json.dumps({str(p.relative_to(site)): hashlib.sha256(p.read_bytes()).hexdigest()"
        " for n in names for p in (site / n).rglob('*') if p.suffix in ('.py', '.lua')}))\n"
    )
    installed = json.loads(_ok(podman_run(image.ref, "-c", script, entrypoint="python")))
    stale = sorted(k for k in expected.keys() & installed.keys() if expected[k] != installed[k])
    assert stale == [], f"the image has other contents for {stale[:10]}"
    assert sorted(expected.keys() - installed.keys()) == [], "files missing from the image"
    assert sorted(installed.keys() - expected.keys()) == [], "files the repository no longer has"


def test_the_image_s_own_user_is_10001_without_being_told(image: BuiltImage) -> None:
    """Without ``--user`` (the Dockerfile's USER), as runAsNonRoot requires."""
    out = _ok(podman_run(image.ref, "-c", "import os; print(os.getuid())",
                         entrypoint="python", user=None))  # fmt: skip
    assert out.strip() == "10001"


def test_root_filesystem_is_read_only_and_tmp_is_writable(image: BuiltImage) -> None:
    script = (
        "import pathlib, sys\n"
        "try:\n"
        "    pathlib.Path(sys.prefix, 'probe').write_text('x')\n"
        "    print('root writable')\n"
        "except OSError as exc:\n"
        "    print('root read-only', exc.errno)\n"
        "pathlib.Path('/tmp/probe').write_text('x'); print('tmp writable')\n"
    )
    out = _ok(podman_run(image.ref, "-c", script, entrypoint="python"))
    assert out.split("\n")[0].startswith("root read-only"), out
    assert "tmp writable" in out


def test_airt_demo_completes_inside_the_image(image: BuiltImage) -> None:
    """The README's first command's demo, from the packaged examples, in the image."""
    out = _ok(podman_run(image.ref, "demo", timeout=600))
    last = [line for line in out.splitlines() if line.strip()][-1]
    assert last.startswith("demo: 3 of 3 runs completed"), out[-2000:]


def test_every_process_of_the_chart_starts_from_the_entrypoint(image: BuiltImage) -> None:
    """``airt control-plane|runtime|operator --help``: the commands the chart and the
    operator's pod template run exist in the image (the operator's extra is installed)."""
    for command in ("control-plane", "runtime", "operator"):
        _ok(podman_run(image.ref, command, "--help"))


def test_image_size_is_reported(image: BuiltImage) -> None:
    size_mb = image.size_bytes / 1e6
    print(f"\nimage {image.ref}: {size_mb:.0f} MB")
    inspect = json.loads(_ok(_inspect(image.ref)))
    assert inspect[0]["Config"]["User"] == "10001:10001"
    assert size_mb < SIZE_CEILING_MB, f"{size_mb:.0f} MB"


def _inspect(ref: str) -> object:
    import subprocess

    return subprocess.run(["podman", "image", "inspect", ref], capture_output=True, text=True)


def test_local_containers_start_like_the_image() -> None:
    """``tests.e2e.cluster.LocalContainer`` (a pod template as a local process, used where
    no node is needed) gets the final image's entrypoint and ENV (no image needed)."""
    import shlex

    from tests.e2e.cluster import IMAGE_ENTRYPOINT, IMAGE_ENV
    from tests.e2e.test_chart import dockerfile_stages

    stages, _ = dockerfile_stages()
    final = stages[-1]
    env = dict(
        item.split("=", 1) for word, args in final if word == "ENV" for item in shlex.split(args)
    )
    (entrypoint,) = [json.loads(args) for word, args in final if word == "ENTRYPOINT"]
    assert tuple(entrypoint) == IMAGE_ENTRYPOINT
    # PATH leads to the image's virtualenv; a local "pod" uses the test venv's airt.
    assert env.pop("PATH") == "/opt/airuntime/bin:$PATH"
    assert env == IMAGE_ENV
