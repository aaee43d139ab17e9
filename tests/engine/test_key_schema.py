"""Every Redis key is built in airuntime/core/keys.py: the Python sources of the
package and of the deployables are scanned for keys put together anywhere else."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
KEYS_MODULE = ROOT / "airuntime" / "core" / "keys.py"
SOURCES = ("airuntime", "runtime_pod", "operator")


def _is_keys_module(node: ast.expr) -> bool:
    """``keys`` or ``airuntime.core.keys`` (the way every caller names the module)."""
    if isinstance(node, ast.Name):
        return node.id == "keys"
    return isinstance(node, ast.Attribute) and node.attr == "keys"


def _is_key_builder_call(node: ast.expr) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and _is_keys_module(node.func.value)
    )


def _problem(node: ast.AST, bare_strings: set[int]) -> str | None:
    """What is wrong with ``node`` as far as Redis keys go, or None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        if node.value.startswith("air:") and id(node) not in bare_strings:
            return f"string starting with 'air:': {node.value!r}"
    elif isinstance(node, ast.Attribute):
        if node.attr == "PREFIX" and _is_keys_module(node.value):
            return "keys.PREFIX used outside keys.py"
    elif isinstance(node, ast.ImportFrom):
        if (node.module or "").endswith("core.keys") and "PREFIX" in {a.name for a in node.names}:
            return "PREFIX imported from keys.py"
    elif isinstance(node, ast.BinOp):
        if isinstance(node.op, ast.Add) and (
            _is_key_builder_call(node.left) or _is_key_builder_call(node.right)
        ):
            return "a key builder's result extended with '+'"
    elif isinstance(node, ast.JoinedStr):
        built = [p for p in node.values if isinstance(p, ast.FormattedValue)]
        if len(node.values) > 1 and any(_is_key_builder_call(p.value) for p in built):
            return "a key builder's result inside a longer f-string"
    return None


def key_problems(source: str) -> Iterator[tuple[int, str]]:
    """(line, what) for each Redis key ``source`` builds by hand."""
    tree = ast.parse(source)
    # a bare string statement (docstring) may name keys; it never builds one
    bare_strings = {
        id(stmt.value)
        for stmt in ast.walk(tree)
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
    }
    for node in ast.walk(tree):
        what = _problem(node, bare_strings)
        if what is not None:
            yield getattr(node, "lineno", 0), what


def _python_sources() -> list[Path]:
    files = [p for top in SOURCES for p in sorted((ROOT / top).rglob("*.py"))]
    return [p for p in files if p != KEYS_MODULE]


def test_no_redis_key_is_built_outside_keys_py() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line}: {what}"
        for path in _python_sources()
        for line, what in key_problems(path.read_text())
    ]
    assert len(_python_sources()) > 50, "the scan found the sources"
    assert not found, "Redis keys built outside airuntime/core/keys.py:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "source",
    [
        'lease = f"{keys.PREFIX}:assist:{eid}"',
        'key = f"air:prefix:{p}:seq"',
        'key = "air:executions"',
        "from airuntime.core.keys import PREFIX",
        "item = keys.squeue_item_prefix() + srid",
        'key = f"{keys.run(run_id)}:extra"',
    ],
)
def test_the_scan_recognises_hand_built_keys(source: str) -> None:
    assert list(key_problems(source))


def test_the_scan_leaves_docstrings_and_builder_calls_alone() -> None:
    source = '"""Reads ``air:instance:<id>:inbox``."""\nkey = keys.instance_inbox(iid)\n'
    assert list(key_problems(source)) == []
