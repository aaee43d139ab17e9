"""Configuration files: YAML, validated by a pydantic model, refused with a ConfigError.

The YAML files airuntime reads (the control plane's tokens file, the local stack's
tenant settings file) all fail the same way: a :class:`~airuntime.core.errors.ConfigError`
naming the file and, for a bad value, the entry and field (``tokens.0.roles``), the
reason and the value. Values of secret fields (``secret_fields``) are never shown.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from airuntime.core.errors import ConfigError
from airuntime.core.validation import format_validation_error

M = TypeVar("M", bound=BaseModel)

REDACTED = "<redacted>"


def load_yaml_model(
    path: Path,
    model: type[M],
    *,
    what: str | None = None,
    secret_fields: frozenset[str] = frozenset(),
) -> M:
    """Read ``path`` and validate it as ``model``; ``what`` names the file in the
    "cannot read" error (``tokens file``)."""
    try:
        text = path.read_text()
    except OSError as exc:
        kind = f" {what}" if what else ""
        raise ConfigError(f"{path}: cannot read{kind}: {exc.strerror or exc}") from None
    return parse_yaml_model(text, model, source=str(path), secret_fields=secret_fields)


def parse_yaml_model(
    text: str, model: type[M], *, source: str, secret_fields: frozenset[str] = frozenset()
) -> M:
    """Validate YAML ``text`` as ``model``; errors name ``source``."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML: {exc}") from None
    try:
        return model.model_validate(data)
    except ValidationError as exc:

        def shown(loc: tuple[Any, ...], value: Any) -> Any:
            if loc and loc[-1] in secret_fields:
                return REDACTED
            return _redact(value, secret_fields)

        raise ConfigError(f"{source}: {format_validation_error(exc, redact=shown)}") from None


def _redact(value: Any, secret_fields: frozenset[str]) -> Any:
    if isinstance(value, dict):
        return {
            k: REDACTED if k in secret_fields else _redact(v, secret_fields)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_redact(v, secret_fields) for v in value]
    return value
