"""The example pipelines, shipped inside the package.

Why this module exists: ``airt demo``, ``airt run <example>`` and ``airt examples``
must work wherever airuntime is installed (an editable checkout, a wheel in a fresh
virtualenv, the container image), not only from the repository root. The YAML files
next to this module are package data; this module finds them through
:mod:`importlib.resources`, so no path into the source tree is ever assumed.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

import yaml

__all__ = ["Example", "all_examples", "copy_example", "find_example", "pipeline_path"]

_SUFFIX = ".yaml"


@dataclass(frozen=True, slots=True)
class Example:
    """One packaged example pipeline."""

    name: str
    """File name without ``.yaml``; what ``airt run <name>`` accepts."""
    description: str
    steps: int
    resource: Traversable

    def text(self) -> str:
        return self.resource.read_text(encoding="utf-8")


def _root() -> Traversable:
    return resources.files(__name__)


def _load(resource: Traversable) -> Example:
    doc = yaml.safe_load(resource.read_text(encoding="utf-8")) or {}
    return Example(
        name=resource.name.removesuffix(_SUFFIX),
        description=str(doc.get("description", "")),
        steps=len(doc.get("steps") or []),
        resource=resource,
    )


def all_examples() -> list[Example]:
    """Every packaged example, sorted by name."""
    found = [p for p in _root().iterdir() if p.name.endswith(_SUFFIX)]
    return [_load(p) for p in sorted(found, key=lambda p: p.name)]


def find_example(name: str) -> Example | None:
    """The example called ``name`` (with or without ``.yaml``), or None."""
    wanted = name.removesuffix(_SUFFIX)
    return next((e for e in all_examples() if e.name == wanted), None)


def copy_example(example: Example, destination: Path) -> Path:
    """Write ``example`` to ``destination`` (a directory or a file path); return the file.

    An existing file is never overwritten: :class:`FileExistsError` names it.
    """
    target = destination / f"{example.name}{_SUFFIX}" if destination.is_dir() else destination
    if target.exists():
        raise FileExistsError(f"{target} already exists")
    target.parent.mkdir(parents=True, exist_ok=True)
    with resources.as_file(example.resource) as source:
        shutil.copyfile(source, target)
    return target


@contextlib.contextmanager
def pipeline_path(argument: str) -> Iterator[Path]:
    """The file a pipeline argument names: an existing file wins, then a packaged example
    of that name (``summarize-documents`` or ``summarize-documents.yaml``).

    Raises :class:`FileNotFoundError` whose message says both what was looked for and
    how to list the examples.
    """
    path = Path(argument)
    if path.is_file():
        yield path
        return
    example = find_example(argument) if path.parent == Path(".") else None
    if example is None:
        names = ", ".join(e.name for e in all_examples())
        raise FileNotFoundError(
            f"{argument}: no such file, and no packaged example of that name "
            f"(examples: {names}; `airt examples list`)"
        )
    with resources.as_file(example.resource) as source:
        yield source
