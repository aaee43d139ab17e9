"""Which callables a ``python`` step may name, checked when a pipeline compiles and again
when the handler runs.

Why this module exists: ``callable: "pkg.mod:func"`` is a tenant-written string that
the runtime imports and calls with its own privileges (its environment holds the
platform's Redis credentials). Only the modules the platform operator listed in
``AIRUNTIME_PYTHON_HANDLER_MODULES`` (:mod:`~airuntime.engine.handlers.settings`) may be
reached, and only through plain public names:

* the module must be a configured prefix or below one (``pkg`` allows ``pkg`` and
  ``pkg.sub``, not ``pkgx``); the interpreter's dangerous modules (``builtins``, ``os``,
  ``subprocess``, ``sys``, ``importlib``, ...) and airuntime itself are refused even when
  configured;
* every dotted part of the module and of the attribute path is a public identifier: no
  empty parts (``..``), no ``_private`` or ``__dunder__`` names, so ``obj.__class__``,
  ``__globals__`` and the like cannot be walked;
* at run time (:func:`resolve_callable`) every module met along the attribute path and
  the module that *defines* the final callable must be allowed too, so a permitted module
  that happens to ``import os`` or ``from json import dumps`` does not open them.

The same :func:`callable_problem` text is the compile-time refusal (naming the step, the
callable and the allowed modules) and the run-time :class:`StepFailed`.
"""

from __future__ import annotations

import importlib
import re
import types
from collections.abc import Collection
from typing import Any

__all__ = [
    "ALWAYS_DENIED",
    "CallableRefused",
    "callable_problem",
    "describe_allowed",
    "module_allowed",
    "resolve_callable",
]

#: Top-level modules no configuration can open to tenants.
ALWAYS_DENIED = frozenset(
    {
        "airuntime",
        "builtins",
        "code",
        "codeop",
        "ctypes",
        "gc",
        "importlib",
        "inspect",
        "io",
        "marshal",
        "multiprocessing",
        "nt",
        "os",
        "pathlib",
        "pickle",
        "posix",
        "pty",
        "runpy",
        "shutil",
        "signal",
        "socket",
        "subprocess",
        "sys",
        "threading",
    }
)

_PUBLIC_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")


class CallableRefused(Exception):
    """The callable is not one a ``python`` step may call; ``str()`` says why."""


def describe_allowed(modules: Collection[str]) -> str:
    """``allowed modules: a, b`` or the hint that none is configured."""
    if not modules:
        return "allowed modules: none (the platform sets AIRUNTIME_PYTHON_HANDLER_MODULES)"
    return f"allowed modules: {', '.join(sorted(modules))}"


def module_allowed(name: str, modules: Collection[str]) -> bool:
    """``name`` is one of ``modules`` or below one, and not an always-denied module."""
    if name.split(".", 1)[0] in ALWAYS_DENIED:
        return False
    return any(name == prefix or name.startswith(prefix + ".") for prefix in modules)


def _bad_parts(text: str) -> str | None:
    for part in text.split("."):
        if not part:
            return "an empty name (dots in a row, or a leading or trailing dot)"
        if not _PUBLIC_NAME.match(part):
            return f"{part!r}, which is not a public name (letters, digits, '_'; no leading '_')"
    return None


def callable_problem(spec: object, modules: Collection[str]) -> str | None:
    """Why ``spec`` may not be called with ``modules`` allowed, or None if it may (as far
    as the text shows; :func:`resolve_callable` checks what the names lead to)."""
    if not isinstance(spec, str) or spec.count(":") != 1:
        return f"must look like 'package.module:function' (value={spec!r})"
    module_name, _, attr_path = spec.partition(":")
    for what, text in (("module", module_name), ("attribute path", attr_path)):
        bad = _bad_parts(text)
        if bad is not None:
            return f"callable {spec!r} is refused: its {what} contains {bad}"
    if not module_allowed(module_name, modules):
        return (
            f"callable {spec!r} is refused: module {module_name!r} is not allowed "
            f"({describe_allowed(modules)})"
        )
    return None


def resolve_callable(spec: str, modules: Collection[str]) -> Any:
    """Import and walk ``spec`` after :func:`callable_problem` passed; raise
    :class:`CallableRefused` if the walk leaves the allowed modules, ``ImportError`` or
    ``AttributeError`` if a name is missing."""
    problem = callable_problem(spec, modules)
    if problem is not None:
        raise CallableRefused(problem)
    module_name, _, attr_path = spec.partition(":")
    target: Any = importlib.import_module(module_name)
    for attr in attr_path.split("."):
        target = getattr(target, attr)
        if isinstance(target, types.ModuleType) and not module_allowed(target.__name__, modules):
            raise CallableRefused(
                f"callable {spec!r} is refused: {attr!r} is module {target.__name__!r}, "
                f"which is not allowed ({describe_allowed(modules)})"
            )
    if not callable(target):
        raise CallableRefused(f"callable {spec!r} is refused: it is not callable")
    home = getattr(target, "__module__", None)
    if not isinstance(home, str) or not module_allowed(home, modules):
        raise CallableRefused(
            f"callable {spec!r} is refused: it is defined in {home!r}, which is not "
            f"allowed ({describe_allowed(modules)})"
        )
    return target
