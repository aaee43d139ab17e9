"""The JSON Schema a ``model`` step's JSON reply must match (``with.schema``).

Why this exists: an AI workflow's next step usually reads fields of a model's JSON
reply, and a model answers the shape it was asked for only most of the time. With
``output: json`` and a ``schema``, a reply that parses but does not match is retried by
the step's policy like one that does not parse (a retry may answer better), and the
step fails naming the first mismatch (where in the reply, what the schema says) when
the retries are spent; a step after it reads a reply that matched.

The schema is checked when the pipeline is submitted (a JSON Schema of draft 2020-12,
or the draft its ``$schema`` names; written out, no references), and it may not use
what would act beyond the reply: a ``$ref`` outside the schema itself (resolving one
would fetch a URL) or a regular expression (``pattern``, ``patternProperties``: run on
the model's reply, a pathological one would hold the worker for as long as it
backtracks). Validation is :mod:`jsonschema`'s, without format assertions.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Final
from urllib.parse import unquote

from airuntime.engine.references import iter_strings, mentions_reference

__all__ = ["UnusableSchema", "reply_problem", "schema_problem"]

_REGEX_KEYWORDS: Final = frozenset({"pattern", "patternProperties"})
_UNSUPPORTED: Final = frozenset({"$dynamicRef", "$recursiveRef"})
_QUOTED: Final = 120


_DATA_KEYWORDS: Final = frozenset({"const", "enum", "default", "examples"})
"""Keywords whose values are instances, not schemas: not searched for keywords."""


def _walk(value: Any, at: str = "") -> Iterator[tuple[str, str, Any]]:
    """(location, key, value) of every mapping entry inside ``value`` that is a schema
    keyword (the values of const, enum, default and examples are data)."""
    stack: list[tuple[str, Any]] = [(at, value)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, Mapping):
            for k, v in item.items():
                yield where, str(k), v
                if str(k) not in _DATA_KEYWORDS:
                    stack.append((f"{where}.{k}" if where else str(k), v))
        elif isinstance(item, list):
            stack.extend((f"{where}[{i}]", v) for i, v in enumerate(item))


def _references(value: Any) -> Iterator[str]:
    """Every string inside ``value`` (keys aside) that names a step output or run input."""
    return (text for _, text in iter_strings(value) if mentions_reference(text))


def schema_problem(schema: Any) -> str | None:
    """Why ``schema`` cannot be a step's reply schema, or None."""
    if not isinstance(schema, Mapping) or not schema:
        return "must be a JSON Schema object (a mapping, not empty)"
    for where, key, value in _walk(schema):
        at = f" (at {where})" if where else ""
        if key in _REGEX_KEYWORDS:
            return (
                f"{key!r}{at} is not supported: a regular expression would run on the model's "
                "reply (a pathological one holds the worker while it backtracks)"
            )
        if key in _UNSUPPORTED:
            return f"{key!r}{at} is not supported (use $ref with a JSON pointer, '#/...')"
        if key == "$ref":
            if not (isinstance(value, str) and (value == "#" or value.startswith("#/"))):
                return (
                    f"$ref{at} must be a JSON pointer inside the schema ('#/...'), not "
                    f"{str(value)[:80]!r}"
                )
            if not _points_inside(schema, value):
                return f"$ref{at} {value[:80]!r} points at nothing in the schema"
    for text in _references(schema):
        return f"must be written out, not name a step output or run input ({text[:80]!r})"
    from jsonschema import SchemaError, validators

    declared = schema.get("$schema")
    if declared is not None and (
        not isinstance(declared, str) or declared.rstrip("#") not in _known_drafts()
    ):
        return (
            f"$schema {str(declared)[:80]!r} is not a JSON Schema draft jsonschema knows "
            "(leave it out for draft 2020-12)"
        )
    cls = validators.validator_for(schema, default=validators.Draft202012Validator)
    try:
        cls.check_schema(dict(schema))
    except SchemaError as exc:
        where = ".".join(str(p) for p in exc.absolute_path)
        at = f" at {where}" if where else ""
        return f"is not a valid JSON Schema{at}: {exc.message[:200]}"
    return None


def _known_drafts() -> set[str]:
    """The ``$schema`` URIs jsonschema has a validator for (no trailing ``#``)."""
    from jsonschema import validators

    known = (
        validators.Draft4Validator,
        validators.Draft6Validator,
        validators.Draft7Validator,
        validators.Draft201909Validator,
        validators.Draft202012Validator,
    )
    uris = {str(c.META_SCHEMA.get(k, "")) for c in known for k in ("$schema", "$id", "id")}
    return {u.rstrip("#") for u in uris if u}


def _points_inside(root: Mapping[str, Any], ref: str) -> bool:
    """The JSON pointer of ``ref`` (``#`` or ``#/a/b``) names a value inside ``root``."""
    node: Any = root
    for raw in ref[2:].split("/") if ref != "#" else ():
        part = unquote(raw).replace("~1", "/").replace("~0", "~")
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return False
    return True


class UnusableSchema(ValueError):
    """The schema passed its checks and still could not be applied (not the reply's fault)."""


def reply_problem(schema: Mapping[str, Any], reply: Any) -> str | None:
    """How ``reply`` (the parsed JSON) departs from ``schema``: the first mismatch by
    location in the reply, or None when it matches. Raises :class:`UnusableSchema` when
    the schema itself cannot be applied."""
    from jsonschema import validators

    cls = validators.validator_for(schema, default=validators.Draft202012Validator)
    try:
        errors = sorted(cls(schema).iter_errors(reply), key=lambda e: list(map(str, e.path)))
    except RecursionError:
        raise UnusableSchema(
            "the reply could not be checked: it is nested too deeply for the schema, or the "
            "schema refers to itself without end"
        ) from None
    except Exception as exc:  # jsonschema's and referencing's own errors
        raise UnusableSchema(f"the step's schema could not be applied: {exc}"[:300]) from None
    if not errors:
        return None
    first = errors[0]
    where = "".join(f"[{p!r}]" for p in first.absolute_path) or "the reply"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    message = first.message if len(first.message) <= _QUOTED else first.message[:_QUOTED] + "..."
    return f"{where}: {message}{more}"
