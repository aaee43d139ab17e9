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
        # A package, or a directory of data files (Lua scripts, templates): setuptools
        # warns about an importable directory listed nowhere, and may stop shipping it.
        for directory in [base, *base.rglob("*")]:
            if not directory.is_dir() or directory.name == "__pycache__":
                continue
            if any(f.is_file() and f.suffix != ".pyc" for f in directory.iterdir()):
                in_tree.add(".".join([top, *directory.relative_to(base).parts]))
    assert set(setuptools["packages"]) == in_tree
