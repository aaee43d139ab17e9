"""References between steps: ``${steps.<id>.output[.<path>]}`` and ``${inputs.<name>[.<path>]}``.

Step inputs (the ``with`` mapping of a step) may mention the output of an earlier step or
a run input.  The compiler uses :func:`find_step_refs` to turn those mentions into implied
dependencies and to reject references to unknown steps before anything runs; the engine
uses :func:`resolve` to substitute the values right before a handler is invoked.

Grammar (inside any string value, at any depth of dicts and lists; keys are never scanned)::

    ${steps.<step-id>.output}             the whole output of a step
    ${steps.<step-id>.output.<a>.<b>}     a nested value: dict key, or list index (digits)
    ${inputs.<name>}                      a run input
    ${inputs.<name>.<a>}                  a nested value of a run input
    $${steps....} / $${inputs....}        escape: the literal text ``${steps....}``

A string that is exactly one reference is replaced by the referenced value itself, keeping
its JSON type; otherwise each reference is interpolated as text (strings as they are, any
other value JSON-encoded).  Anything else that looks like ``${name}`` is left untouched, so
``string.Template`` placeholders in a ``template`` step still work.  A ``${steps.`` or
``${inputs.`` that does not follow the grammar is a :class:`ReferenceSyntaxError`, which the
compiler reports with the location of the string.
"""

from __future__ import annotations

import copy
import functools
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "Reference",
    "ReferenceResolutionError",
    "ReferenceSyntaxError",
    "find_refs",
    "find_step_refs",
    "input_ref",
    "iter_strings",
    "mentions_reference",
    "parse_references",
    "resolve",
    "step_ref",
]

STEP_ID_PATTERN = r"[A-Za-z_][A-Za-z0-9_-]{0,127}"
_SEGMENT = r"[^.{}\s]+"

# `(\$?)` catches the `$${...}` escape; the body must start with `steps` or `inputs` followed
# by a dot or the closing brace, so `${stepsize}` or `${doc}` are not references at all.
_TOKEN = re.compile(r"(\$?)\$\{((?:steps|inputs)(?:\.[^{}]*)?)\}")
_STEP_BODY = re.compile(rf"steps\.({STEP_ID_PATTERN})\.output((?:\.{_SEGMENT})*)")
_INPUT_BODY = re.compile(rf"inputs\.({_SEGMENT})((?:\.{_SEGMENT})*)")
_OPENING = re.compile(r"\$\{(?:steps|inputs)(?:[.}]|$)")


class ReferenceSyntaxError(ValueError):
    """A string contains ``${steps.``/``${inputs.`` that is not a well-formed reference."""

    def __init__(self, reference: str, message: str) -> None:
        self.reference = reference
        self.detail = message
        super().__init__(f"{message} in {reference!r}")


class ReferenceResolutionError(LookupError):
    """A reference points at a step output or run input (or a path inside it) that is missing."""

    def __init__(self, reference: str, message: str) -> None:
        self.reference = reference
        self.detail = message
        super().__init__(f"{reference}: {message}")

    def __str__(self) -> str:  # LookupError would repr() a single argument
        return f"{self.reference}: {self.detail}"


@dataclass(frozen=True, slots=True)
class Reference:
    """One parsed reference.  ``source`` is ``"steps"`` or ``"inputs"``; ``name`` is the step
    id or the input name; ``path`` the keys/indexes below the output or input."""

    text: str
    source: Literal["steps", "inputs"]
    name: str
    path: tuple[str, ...]


_Part = str | Reference


def step_ref(step_id: str, *path: str | int) -> str:
    """Build ``${steps.<step_id>.output[.<path>]}``."""
    suffix = "".join(f".{p}" for p in path)
    return f"${{steps.{step_id}.output{suffix}}}"


def input_ref(name: str, *path: str | int) -> str:
    """Build ``${inputs.<name>[.<path>]}``."""
    suffix = "".join(f".{p}" for p in path)
    return f"${{inputs.{name}{suffix}}}"


def mentions_reference(text: str) -> bool:
    """``text`` names (or starts to name) a step output or a run input: what
    :func:`resolve` would read, or refuse as malformed."""
    return "${" in text and _OPENING.search(text) is not None


def _snippet(text: str, start: int) -> str:
    end = text.find("}", start)
    piece = text[start : end + 1] if end != -1 else text[start:]
    return piece if len(piece) <= 80 else piece[:77] + "..."


def _check_literal(text: str, start: int, end: int) -> None:
    m = _OPENING.search(text, start, end)
    if m is not None:
        raise ReferenceSyntaxError(
            _snippet(text, m.start()),
            "malformed reference (expected ${steps.<id>.output[.<path>]} "
            "or ${inputs.<name>[.<path>]})",
        )


@functools.lru_cache(maxsize=4096)
def _parse(text: str) -> tuple[_Part, ...]:
    parts: list[_Part] = []
    pos = 0
    for m in _TOKEN.finditer(text):
        _check_literal(text, pos, m.start())
        if m.start() > pos:
            parts.append(text[pos : m.start()])
        if m.group(1):  # `$${...}` -> literal `${...}`
            parts.append(m.group(0)[1:])
        else:
            parts.append(_parse_body(m.group(0), m.group(2)))
        pos = m.end()
    _check_literal(text, pos, len(text))
    if pos < len(text):
        parts.append(text[pos:])
    return tuple(parts)


def _parse_body(token: str, body: str) -> Reference:
    m = _STEP_BODY.fullmatch(body)
    if m is not None:
        path = tuple(m.group(2).split(".")[1:])
        return Reference(text=token, source="steps", name=m.group(1), path=path)
    m = _INPUT_BODY.fullmatch(body)
    if m is not None:
        path = tuple(m.group(2).split(".")[1:])
        return Reference(text=token, source="inputs", name=m.group(1), path=path)
    if body.startswith("steps"):
        expected = "${steps.<id>.output} or ${steps.<id>.output.<path>}"
    else:
        expected = "${inputs.<name>} or ${inputs.<name>.<path>}"
    raise ReferenceSyntaxError(token, f"malformed reference (expected {expected})")


def parse_references(text: str) -> list[Reference]:
    """All references in one string, in order.  Raises :class:`ReferenceSyntaxError`."""
    if "${" not in text:
        return []
    return [p for p in _parse(text) if isinstance(p, Reference)]


def iter_strings(value: Any) -> Iterator[tuple[tuple[str | int, ...], str]]:
    """Yield ``(location, string)`` for every string value inside ``value`` (iteratively, so
    deep nesting never hits the recursion limit).  Dict keys are not visited."""
    stack: list[tuple[tuple[str | int, ...], Any]] = [((), value)]
    while stack:
        loc, item = stack.pop()
        if isinstance(item, str):
            yield loc, item
        elif isinstance(item, Mapping):
            children = [((*loc, str(k)), v) for k, v in item.items()]
            stack.extend(reversed(children))
        elif isinstance(item, list | tuple):
            stack.extend(reversed([((*loc, i), v) for i, v in enumerate(item)]))


def find_refs(value: Any) -> list[Reference]:
    """Every reference inside ``value`` in document order (with repetitions)."""
    return [ref for _, text in iter_strings(value) for ref in parse_references(text)]


def find_step_refs(value: Any) -> set[str]:
    """Ids of the steps whose outputs ``value`` references."""
    return {ref.name for ref in find_refs(value) if ref.source == "steps"}


def _describe(value: Any) -> str:
    if isinstance(value, Mapping):
        keys = ", ".join(repr(k) for k in list(value)[:10])
        more = ", ..." if len(value) > 10 else ""
        return f"object with keys [{keys}{more}]" if value else "empty object"
    if isinstance(value, list):
        return f"list of length {len(value)}"
    return f"{type(value).__name__} value"


def _lookup(ref: Reference, outputs: Mapping[str, Any], inputs: Mapping[str, Any]) -> Any:
    if ref.source == "steps":
        if ref.name not in outputs:
            raise ReferenceResolutionError(ref.text, f"step {ref.name!r} has no output")
        value = outputs[ref.name]
        walked = f"steps.{ref.name}.output"
    else:
        if ref.name not in inputs:
            known = ", ".join(sorted(map(str, inputs))) or "none"
            raise ReferenceResolutionError(
                ref.text, f"no run input named {ref.name!r} (inputs: {known})"
            )
        value = inputs[ref.name]
        walked = f"inputs.{ref.name}"
    for key in ref.path:
        if isinstance(value, Mapping):
            if key not in value:
                raise ReferenceResolutionError(
                    ref.text, f"{walked} has no key {key!r} ({_describe(value)})"
                )
            value = value[key]
        elif isinstance(value, list):
            if not key.isdigit():
                raise ReferenceResolutionError(
                    ref.text, f"{walked} is a list; {key!r} is not an index"
                )
            if int(key) >= len(value):
                raise ReferenceResolutionError(
                    ref.text, f"{walked} has no index {key} ({_describe(value)})"
                )
            value = value[int(key)]
        else:
            raise ReferenceResolutionError(
                ref.text, f"{walked} is a {_describe(value)}, it has no {key!r}"
            )
        walked = f"{walked}.{key}"
    return value


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _resolve_string(text: str, outputs: Mapping[str, Any], inputs: Mapping[str, Any]) -> Any:
    if "${" not in text:
        return text
    parts = _parse(text)
    if len(parts) == 1 and isinstance(parts[0], Reference):
        # exactly one reference: keep the JSON type; copy so handlers cannot mutate outputs
        return copy.deepcopy(_lookup(parts[0], outputs, inputs))
    return "".join(
        _as_text(_lookup(p, outputs, inputs)) if isinstance(p, Reference) else p for p in parts
    )


def resolve(value: Any, outputs: Mapping[str, Any], inputs: Mapping[str, Any]) -> Any:
    """Return a copy of ``value`` with every reference substituted.

    ``outputs`` maps step id -> output; ``inputs`` are the run inputs.  Raises
    :class:`ReferenceResolutionError` naming the reference when a step output, run input or
    a key/index along the path is missing, and :class:`ReferenceSyntaxError` for malformed
    references (the compiler rejects those earlier).
    """
    # The exact JSON types first: a step's inputs are parsed JSON/YAML, and the Mapping
    # check (an ABC's isinstance) was a tenth of a fan-out step's worker Python.
    kind = type(value)
    if kind is dict:
        return {k: resolve(v, outputs, inputs) for k, v in value.items()} if value else {}
    if kind is str:
        return _resolve_string(value, outputs, inputs)
    if kind is list:
        return [resolve(v, outputs, inputs) for v in value]
    if value is None or kind is int or kind is float or kind is bool:
        return value
    if isinstance(value, str):
        return _resolve_string(value, outputs, inputs)
    if isinstance(value, Mapping):
        return {k: resolve(v, outputs, inputs) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [resolve(v, outputs, inputs) for v in value]
    return value
