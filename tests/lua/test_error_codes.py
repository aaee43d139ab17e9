"""The Lua return codes and the error classes agree: one class per code, no code unmapped."""

from __future__ import annotations

import re

import pytest

from airuntime.core.errors import EngineError, engine_errors, error_for
from airuntime.core.scripts import LUA_DIR

#: ``return {-5, status}``, ``return -2``, ``code = -4`` (per-item codes of batch replies)
_RETURNED = re.compile(r"\breturn\s*\{?\s*(-\d+)\b|\bcode\s*=\s*(-\d+)\b")


def _codes_returned_by_scripts() -> dict[int, list[str]]:
    found: dict[int, list[str]] = {}
    for path in sorted(LUA_DIR.glob("*.lua")):
        for m in _RETURNED.finditer(path.read_text()):
            code = int(m.group(1) or m.group(2))
            found.setdefault(code, []).append(path.name)
    return found


def test_every_negative_code_a_script_returns_maps_to_exactly_one_class() -> None:
    returned = _codes_returned_by_scripts()
    table = engine_errors()
    assert returned, "the pattern found no return codes at all"
    unmapped = {code: names for code, names in returned.items() if code not in table}
    assert not unmapped, f"codes returned by scripts without an error class: {unmapped}"
    assert len(set(table.values())) == len(table), "one class per code"
    for code, cls in table.items():
        assert cls.code == code and issubclass(cls, EngineError)


def test_every_error_class_code_is_returned_by_some_script() -> None:
    returned = _codes_returned_by_scripts()
    unused = {cls.__name__: code for code, cls in engine_errors().items() if code not in returned}
    assert not unused, f"error classes no script returns: {unused}"


@pytest.mark.parametrize("code", sorted(engine_errors()))
def test_error_for_builds_the_class_of_the_code_with_its_template(code: int) -> None:
    cls = engine_errors()[code]
    err = error_for(code, execution_id="ex-1", step_id="s", detail="Paused")
    assert type(err) is cls
    assert str(err) == cls.template.format(eid="ex-1", step="s", detail="Paused")
    assert (err.execution_id, err.step_id) == ("ex-1", "s")


def test_an_unknown_code_is_a_plain_engine_error() -> None:
    err = error_for(-99, execution_id="ex-1")
    assert type(err) is EngineError and "-99" in str(err)
