"""Secret references: ``${secrets.<NAME>}`` in an ``http`` step's header values.

Why this exists: a tenant's own credential for a service its ``http`` steps call must not
be written in the pipeline, where the plan, the run's record, its history and every
reader of the run would hold it. The pipeline names a secret; the tenant stores the value
through the control plane (write-only: :mod:`airuntime.engine.tenant_secrets`); the runtime
puts it into the request's headers right before sending and writes ``***`` in its place
wherever the step's output or error would carry it.

Grammar and where it may appear (checked at submit, :func:`secret_problem`; the runtime
substitutes nowhere else)::

    headers:
      Authorization: "Bearer ${secrets.API_TOKEN}"   # one or more names in a header value

* only in a string value of an ``http`` step's ``with.headers`` mapping;
* a header value that names a secret names no ``${steps...}`` or ``${inputs...}``: what
  an earlier step returned (which may come from anywhere) can never make the runtime
  put a secret where the author did not write one;
* a name is a letter or ``_``, then letters, digits or ``_``, at most 64 characters.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, Final

from airuntime.engine.references import mentions_reference

__all__ = [
    "SECRET_NAME_PATTERN",
    "SECRET_REF_HANDLER",
    "UnknownSecret",
    "header_templates",
    "scrub",
    "scrub_value",
    "secret_problem",
    "secret_uses",
    "substitute",
]

SECRET_NAME_PATTERN: Final = r"[A-Za-z_][A-Za-z0-9_]{0,63}"
SECRET_REF_HANDLER: Final = "http"
"""The one handler whose inputs may name secrets."""

_MARK: Final = "${secrets"
_TOKEN = re.compile(r"\$\{secrets\.(" + SECRET_NAME_PATTERN + r")\}")
SCRUBBED: Final = "***"


class UnknownSecret(LookupError):
    """A step names a secret its tenant has not stored (deleted since the submit)."""

    def __init__(self, names: Iterable[str], tenant_id: str) -> None:
        self.names = sorted(set(names))
        listed = ", ".join(repr(n) for n in self.names)
        super().__init__(
            f"secret {listed} is not defined for tenant {tenant_id!r} "
            "(set it with PUT /v1/tenants/{tenant}/secrets/{name} or `airt secrets set`)"
        )


def names_in(text: str) -> list[str]:
    """The secret names a well-formed string refers to, in order."""
    return _TOKEN.findall(text) if _MARK in text else []


def _malformed(text: str) -> str | None:
    """The first ``${secrets`` that does not start a well-formed reference, from there."""
    at = 0
    while (at := text.find(_MARK, at)) >= 0:
        if _TOKEN.match(text, at) is None:
            return text[at : at + 40]
        at += len(_MARK)
    return None


def secret_problem(handler: str, loc: tuple[str | int, ...], text: str) -> str | None:
    """Why the string ``text`` at ``loc`` (a path inside a step's ``with``) may not name
    a secret as it does, or None when it names none or names them where allowed."""
    if _MARK not in text:
        return None
    if handler != SECRET_REF_HANDLER or len(loc) != 2 or loc[0] != "headers":
        return (
            "secrets can be named only in the header values of an 'http' step (with.headers.<name>)"
        )
    bad = _malformed(text)
    if bad is not None:
        return (
            f"malformed secret reference {bad!r}: write ${{secrets.NAME}}, NAME a letter or _ "
            "then letters, digits or _, at most 64 characters"
        )
    if mentions_reference(text):
        return (
            "a header value that names a secret cannot also name a step output or a run "
            "input (put them in separate headers)"
        )
    return None


def header_templates(handler: str, inputs: Any) -> dict[str, str]:
    """The headers of a step's plan-time ``with`` (``inputs``, before references are
    resolved) that name secrets: header -> its value as written. Empty for any handler
    but ``http``: nothing else is ever substituted."""
    if handler != SECRET_REF_HANDLER or not isinstance(inputs, Mapping):
        return {}
    headers = inputs.get("headers")
    if not isinstance(headers, Mapping):
        return {}
    return {
        str(k): v
        for k, v in headers.items()
        if isinstance(v, str) and _MARK in v and secret_problem(handler, ("headers", k), v) is None
    }


def referenced(templates: Mapping[str, str]) -> set[str]:
    """Every name the header templates refer to."""
    return {name for text in templates.values() for name in names_in(text)}


def secret_uses(steps: Iterable[Any]) -> list[tuple[str, str, list[str]]]:
    """``(step id, header, names)`` for each header of a plan's steps (anything with
    ``id``, ``handler`` and ``inputs``) that names secrets."""
    return [
        (step.id, header, names_in(text))
        for step in steps
        for header, text in header_templates(step.handler, step.inputs).items()
    ]


def substitute(template: str, values: Mapping[str, str]) -> str:
    """``template`` with each reference replaced by its value (every name must be in
    ``values``)."""
    return _TOKEN.sub(lambda m: values[m.group(1)], template)


MIN_CUT_PREFIX: Final = 4
"""A text ending in this many or more leading characters of a value ends in a cut copy."""


def _longest_first(values: Iterable[str]) -> list[str]:
    return sorted({v for v in values if v}, key=len, reverse=True)


def _replace_all(text: str, ordered: list[str]) -> str:
    for value in ordered:
        if value in text:
            text = text.replace(value, SCRUBBED)
    return text


def scrub(text: str, values: Iterable[str]) -> str:
    """``text`` with every occurrence of each value replaced by ``***``, longer values
    first (a value that contains another is scrubbed whole), and a copy cut short at the
    end of the text (an error quoting the first 200 characters of a reply) as well."""
    ordered = _longest_first(values)
    text = _replace_all(text, ordered)
    for value in ordered:
        for n in range(len(value) - 1, MIN_CUT_PREFIX - 1, -1):
            if text.endswith(value[:n]):
                return text[:-n] + SCRUBBED
    return text


def scrub_value(value: Any, secrets: Iterable[str]) -> Any:
    """A JSON value (a step's output) with :func:`scrub` applied to every string in it,
    keys included: the structure is kept, so the result is still the output's JSON
    (replacing inside the encoded text could break a number or an escape)."""
    ordered = _longest_first(secrets)
    if not ordered:
        return value

    def walk(item: Any) -> Any:
        if isinstance(item, str):
            return _replace_all(item, ordered)
        if isinstance(item, Mapping):
            return {_replace_all(str(k), ordered): walk(v) for k, v in item.items()}
        if isinstance(item, list | tuple):
            return [walk(v) for v in item]
        return item

    return walk(value)
