"""What a newcomer meets first: ``airt`` starts in any install, the examples ship with
the package, and a missing optional part is a clear message, never a traceback.

The whole first contact (clean clone, fresh venv with no extras, the README's first
command verbatim; then a wheel used from ``/``) is ``scripts/first-contact.sh``, which
``.ci/run`` runs before the suite. These tests pin the pieces it relies on.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from airuntime.examples import all_examples, find_example, pipeline_path

ROOT = Path(__file__).resolve().parents[2]


def airt(
    *args: str, cwd: Path | str = "/", pythonpath: list[Path] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "AIRUNTIME_REDIS_URL"}
    env["COLUMNS"] = "200"
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(str(p) for p in pythonpath)
    return subprocess.run(
        [sys.executable, "-m", "airuntime.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_every_example_in_the_source_tree_is_found_through_the_package() -> None:
    on_disk = sorted(p.stem for p in (ROOT / "airuntime" / "examples").glob("*.yaml"))
    assert [e.name for e in all_examples()] == on_disk
    assert on_disk, "no example pipelines are shipped"
    for example in all_examples():
        assert example.steps > 0 and example.description, example.name


def test_an_existing_file_wins_over_an_example_of_the_same_name(tmp_path: Path) -> None:
    own = tmp_path / "retries.yaml"
    own.write_text("id: mine\nsteps: [{id: a, uses: noop}]\n")
    cwd = Path.cwd()
    os.chdir(tmp_path)
    try:
        with pipeline_path("retries.yaml") as path:
            assert path == Path("retries.yaml")
        with pipeline_path("retries") as path:  # no such file: the packaged example
            assert path.read_text() == find_example("retries").text()  # type: ignore[union-attr]
    finally:
        os.chdir(cwd)


def test_an_unknown_pipeline_names_the_argument_and_the_examples() -> None:
    with pytest.raises(FileNotFoundError) as info, pipeline_path("no-such-pipeline"):
        pass
    assert "no-such-pipeline: no such file" in str(info.value)
    assert "summarize-documents" in str(info.value)


def test_airt_runs_a_packaged_example_by_name_from_any_directory() -> None:
    result = airt("run", "summarize-documents", "--json", cwd="/")
    assert result.returncode == 0, result.stderr
    assert '"status": "Succeeded"' in result.stdout


def test_examples_copy_writes_files_and_never_overwrites(tmp_path: Path) -> None:
    first = airt("examples", "copy", "retries", "human-input", "--to", str(tmp_path / "ex"))
    assert first.returncode == 0, first.stderr
    copied = sorted(p.name for p in (tmp_path / "ex").iterdir())
    assert copied == ["human-input.yaml", "retries.yaml"]
    (tmp_path / "ex" / "retries.yaml").write_text("# edited\n")
    again = airt("examples", "copy", "retries", "--to", str(tmp_path / "ex"))
    assert again.returncode == 2
    assert "already exists (not overwritten)" in again.stderr
    assert (tmp_path / "ex" / "retries.yaml").read_text() == "# edited\n"


def test_examples_show_and_unknown_names() -> None:
    shown = airt("examples", "show", "human-input")
    assert shown.returncode == 0
    assert shown.stdout == find_example("human-input").text()  # type: ignore[union-attr]
    unknown = airt("examples", "show", "nope")
    assert unknown.returncode == 2
    assert "no packaged example is called 'nope'" in unknown.stderr


def test_operator_without_the_kubernetes_extra_names_the_extra(tmp_path: Path) -> None:
    # A kopf that cannot be imported stands for an install without the extra.
    (tmp_path / "kopf").mkdir()
    (tmp_path / "kopf" / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'kopf'\", name='kopf')\n"
    )
    listed = airt("--help", pythonpath=[tmp_path])
    assert listed.returncode == 0, listed.stderr
    assert "operator" in listed.stdout
    result = airt("operator", pythonpath=[tmp_path])
    assert result.returncode == 2
    assert "pip install 'airuntime[kubernetes]'" in result.stderr
    assert "missing: kopf" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_a_plugin_that_cannot_load_is_listed_and_explains_itself(tmp_path: Path) -> None:
    dist = tmp_path / "broken_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[airuntime.commands]\nbroken = broken_plugin_module_that_does_not_exist:register\n"
    )
    listed = airt("--help", pythonpath=[tmp_path])
    assert listed.returncode == 0, listed.stderr
    assert "broken" in listed.stdout and "demo" in listed.stdout
    result = airt("broken", pythonpath=[tmp_path])
    assert result.returncode == 2
    assert "airt broken is unavailable: ModuleNotFoundError" in result.stderr
    assert "Traceback" not in result.stderr


def test_version_option() -> None:
    from airuntime import __version__

    result = airt("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"airt {__version__}"
