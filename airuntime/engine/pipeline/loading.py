"""Reading pipelines: strict YAML/JSON decoding and validation into a :class:`PipelineSpec`.

Duplicate keys are errors (YAML and JSON would silently keep the last one), syntax
errors carry line and column, files are read up to the size limit only, and pydantic's
validation errors are rewritten as :class:`~airuntime.engine.pipeline.problems.Problem`
lines that name the field (with a "did you mean" for misspelt ones).
"""

from __future__ import annotations

import difflib
import json
import re
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from airuntime.core.gc_tuning import collector_paused
from airuntime.engine.pipeline.problems import PipelineError, Problem, fmt_value, format_loc
from airuntime.engine.pipeline.spec import DEFAULT_LIMITS, PipelineLimits, PipelineSpec


def _unwrap_models(annotation: Any) -> list[type[BaseModel]]:
    """The model classes inside ``X``, ``X | None``, ``list[X]``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType, list):
        return [m for arg in typing.get_args(annotation) for m in _unwrap_models(arg)]
    return []


def _model_at(root: type[BaseModel], loc: Sequence[str | int]) -> type[BaseModel] | None:
    model: type[BaseModel] | None = root
    for part in loc:
        if isinstance(part, int) or model is None:
            continue
        nxt: type[BaseModel] | None = None
        for name, info in model.model_fields.items():
            if part in (name, info.alias):
                found = _unwrap_models(info.annotation)
                nxt = found[0] if found else None
                break
        model = nxt
    return model


def convert_validation_error(
    exc: ValidationError, root: type[BaseModel] = PipelineSpec
) -> list[Problem]:
    """pydantic errors -> ``loc: message (value=...)`` problems."""
    problems: list[Problem] = []
    for err in exc.errors(include_url=False):
        loc = tuple(err["loc"])
        where = format_loc(loc) or "pipeline"
        kind = err["type"]
        msg = err["msg"].removeprefix("Value error, ")
        msg = re.sub(r" or instance of \w+", "", msg)
        if kind == "missing":
            problems.append(Problem(where, "field required"))
        elif kind == "extra_forbidden" and loc and isinstance(loc[-1], str):
            parent = _model_at(root, loc[:-1])
            allowed = (
                [info.alias or name for name, info in parent.model_fields.items()]
                if parent is not None
                else []
            )
            hint = difflib.get_close_matches(loc[-1], allowed, n=1)
            text = f"unknown field {loc[-1]!r}"
            if hint:
                text += f", did you mean {hint[0]!r}?"
            if allowed:
                text += f" (allowed: {', '.join(allowed)})"
            problems.append(Problem(where, text))
        else:
            problems.append(Problem(where, f"{msg} (value={fmt_value(err.get('input'))})"))
    return problems


def parse_pipeline(data: Any, *, source: str | None = None) -> PipelineSpec:
    """Validate already-decoded data (a mapping) into a :class:`PipelineSpec`."""
    if isinstance(data, PipelineSpec):
        return data
    try:
        with collector_paused():  # a large pipeline is many objects, none of them garbage
            return PipelineSpec.model_validate(data)
    except ValidationError as exc:
        raise PipelineError(convert_validation_error(exc), source=source) from None


class _StrictYamlLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys instead of keeping the last one."""


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: dict[tuple[str, str], yaml.Node] = {}
    for key_node, _ in node.value:
        if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
            continue
        ident = (key_node.tag, key_node.value)
        if ident in seen:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping",
                node.start_mark,
                f"found duplicate key {key_node.value!r}",
                key_node.start_mark,
            )
        seen[ident] = key_node
    return loader.construct_mapping(node, deep=True)


_StrictYamlLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
    _construct_mapping,
)


def _json_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _decode(text: str, suffix: str) -> Any:
    """Decode a document; raises :class:`PipelineError` with line/column on syntax errors."""
    if suffix == ".json":
        try:
            return json.loads(text, object_pairs_hook=_json_pairs)
        except json.JSONDecodeError as exc:
            where = f"line {exc.lineno}, column {exc.colno}"
            raise PipelineError([Problem(where, f"invalid JSON: {exc.msg}")]) from None
        except ValueError as exc:  # from _json_pairs
            raise PipelineError([Problem("", f"invalid JSON: {exc}")]) from None
    try:
        # _StrictYamlLoader is a SafeLoader: no arbitrary Python objects
        return yaml.load(text, Loader=_StrictYamlLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        what = " ".join(filter(None, [exc.context, exc.problem])) or str(exc)
        raise PipelineError([Problem(where, f"invalid YAML: {what}")]) from None
    except yaml.YAMLError as exc:
        raise PipelineError([Problem("", f"invalid YAML: {exc}")]) from None


_SUFFIXES = (".yaml", ".yml", ".json")


def load_pipeline(path: str | Path, *, limits: PipelineLimits = DEFAULT_LIMITS) -> PipelineSpec:
    """Read a ``.yaml``/``.yml``/``.json`` pipeline file into a validated spec.

    Every failure (unreadable file, unknown suffix, too large, syntax error, invalid
    content) is a :class:`PipelineError` whose lines start with the path.
    """
    path = Path(path)
    source = str(path)
    suffix = path.suffix.lower()
    if suffix not in _SUFFIXES:
        raise PipelineError(
            f"unsupported file type {path.suffix or '(none)'!r} (expected one of: "
            f"{', '.join(_SUFFIXES)})",
            source=source,
        )
    try:
        with path.open("rb") as fh:  # never read more than the limit allows
            raw = fh.read(limits.max_pipeline_bytes + 1)
    except OSError as exc:
        raise PipelineError(f"cannot read: {exc.strerror or exc}", source=source) from None
    if len(raw) > limits.max_pipeline_bytes:
        raise PipelineError(
            f"the file is over the limit of {limits.max_pipeline_bytes} bytes", source=source
        )
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise PipelineError(f"not UTF-8: {exc}", source=source) from None
    try:
        data = _decode(text, suffix)
    except PipelineError as exc:
        raise PipelineError(exc.problems, source=source) from None
    except RecursionError:
        raise PipelineError("nested too deeply", source=source) from None
    if data is None:
        raise PipelineError("pipeline: the document is empty", source=source)
    return parse_pipeline(data, source=source)
