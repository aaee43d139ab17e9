"""The layers of the source tree, enforced with import-linter (see .importlinter), and
the package list of the wheel kept equal to the tree."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_import_layer_contracts_hold() -> None:
    declared = len(
        re.findall(r"^\[importlinter:contract:", (ROOT / ".importlinter").read_text(), re.M)
    )
    assert declared >= 3
    exe = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    result = subprocess.run([exe], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"Contracts: {declared} kept, 0 broken" in result.stdout


def test_every_package_of_the_tree_is_in_the_wheel() -> None:
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    package_dirs = setuptools["package-dir"]
    in_tree = set()
    for top, folder in package_dirs.items():
        base = ROOT / folder
        for init in base.rglob("__init__.py"):
            rel = init.parent.relative_to(base)
            in_tree.add(".".join([top, *rel.parts]))
    assert set(setuptools["packages"]) == in_tree
