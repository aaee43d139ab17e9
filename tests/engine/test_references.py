"""References between steps: parsing, discovery and resolution."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airuntime.engine.references import (
    Reference,
    ReferenceResolutionError,
    ReferenceSyntaxError,
    find_refs,
    find_step_refs,
    input_ref,
    parse_references,
    resolve,
    step_ref,
)

OUTPUTS: dict[str, Any] = {
    "fetch": {"items": [{"name": "a"}, {"name": "b"}], "count": 2, "ok": True, "none": None},
    "text": "hello",
    "number": 1.5,
    "nothing": None,
}
INPUTS: dict[str, Any] = {"topic": "cats", "cfg": {"depth": 3}, "tags": ["x", "y"]}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            "${steps.fetch.output}",
            [Reference("${steps.fetch.output}", "steps", "fetch", ())],
            id="a whole step output",
        ),
        pytest.param(
            "${steps.fetch-2.output.items.0.name}",
            [
                Reference(
                    "${steps.fetch-2.output.items.0.name}",
                    "steps",
                    "fetch-2",
                    ("items", "0", "name"),
                )
            ],
            id="a path below a step output",
        ),
        pytest.param(
            "${inputs.cfg.depth}",
            [Reference("${inputs.cfg.depth}", "inputs", "cfg", ("depth",))],
            id="a path below a run input",
        ),
        pytest.param(
            "a ${steps.x.output} b ${inputs.y} c",
            [
                Reference("${steps.x.output}", "steps", "x", ()),
                Reference("${inputs.y}", "inputs", "y", ()),
            ],
            id="several references in one string, in order",
        ),
        pytest.param("no refs here", [], id="a plain string"),
        pytest.param(
            "$doc and ${doc} and ${stepsize}", [], id="template placeholders are not references"
        ),
        pytest.param("$${steps.x.output}", [], id="an escaped reference is not a reference"),
    ],
)
def test_parse_references(text: str, expected: list[Reference]) -> None:
    assert parse_references(text) == expected


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        pytest.param("${steps.a}", "'${steps.a}'", id="missing .output"),
        pytest.param("${steps.a.outputs}", "'${steps.a.outputs}'", id="misspelt output"),
        pytest.param("${steps.a.output.}", "'${steps.a.output.}'", id="an empty path segment"),
        pytest.param("${steps.1a.output}", "'${steps.1a.output}'", id="an invalid step id"),
        pytest.param("${steps}", "'${steps}'", id="steps alone"),
        pytest.param("${inputs}", "'${inputs}'", id="inputs alone"),
        pytest.param("${inputs.a b}", "'${inputs.a b}'", id="a space in a path"),
        pytest.param("x ${steps.a.output", "'${steps.a.output'", id="an unterminated reference"),
        pytest.param("${steps.a.output.{x}}", "'${steps.a.output.{x}'", id="braces in a path"),
    ],
)
def test_malformed_references_are_syntax_errors(text: str, fragment: str) -> None:
    with pytest.raises(ReferenceSyntaxError, match="malformed reference") as info:
        parse_references(text)
    assert fragment in str(info.value)


def test_find_step_refs_searches_nested_values_but_not_keys() -> None:
    value = {
        "a": "${steps.one.output}",
        "b": [1, {"c": "x ${steps.two.output.k} ${inputs.q}"}, ["${steps.three.output}"]],
        "${steps.key.output}": "plain",
        "n": None,
        "t": ("${steps.four.output}",),
    }
    assert find_step_refs(value) == {"one", "two", "three", "four"}
    assert [r.name for r in find_refs(value) if r.source == "inputs"] == ["q"]


def test_builders_produce_parseable_references() -> None:
    assert step_ref("a") == "${steps.a.output}"
    assert step_ref("a", "items", 0) == "${steps.a.output.items.0}"
    assert input_ref("topic") == "${inputs.topic}"
    assert parse_references(step_ref("a", "k"))[0].path == ("k",)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param("${steps.fetch.output}", OUTPUTS["fetch"], id="a whole output keeps its type"),
        pytest.param("${steps.fetch.output.count}", 2, id="an integer stays an integer"),
        pytest.param("${steps.fetch.output.ok}", True, id="a boolean stays a boolean"),
        pytest.param("${steps.fetch.output.none}", None, id="null stays null"),
        pytest.param("${steps.fetch.output.items.1.name}", "b", id="list indexes and keys"),
        pytest.param("${steps.nothing.output}", None, id="a step whose output is null"),
        pytest.param("${inputs.tags}", ["x", "y"], id="a run input keeps its type"),
        pytest.param("${inputs.cfg.depth}", 3, id="a path below a run input"),
        pytest.param("n=${steps.fetch.output.count}", "n=2", id="interpolated numbers are JSON"),
        pytest.param(
            "items: ${steps.fetch.output.items}",
            'items: [{"name":"a"},{"name":"b"}]',
            id="interpolated lists are compact JSON",
        ),
        pytest.param(
            "${steps.text.output} ${steps.fetch.output.ok} ${steps.fetch.output.none}",
            "hello true null",
            id="strings are inserted as they are, other values JSON-encoded",
        ),
        pytest.param(
            "${steps.text.output}${inputs.topic}", "hellocats", id="two adjacent references"
        ),
        pytest.param(
            "$${steps.text.output}", "${steps.text.output}", id="an escape yields the literal text"
        ),
        pytest.param(
            "Dear $name, ${name}", "Dear $name, ${name}", id="template placeholders are kept"
        ),
        pytest.param(
            {"a": ["${steps.number.output}", {"b": "${inputs.topic}!"}], "k": 1},
            {"a": [1.5, {"b": "cats!"}], "k": 1},
            id="nested dicts and lists are resolved",
        ),
        pytest.param(
            {"${steps.text.output}": "v"},
            {"${steps.text.output}": "v"},
            id="keys are not resolved",
        ),
    ],
)
def test_resolve(value: Any, expected: Any) -> None:
    assert resolve(value, OUTPUTS, INPUTS) == expected


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        pytest.param(
            "${steps.ghost.output}",
            "${steps.ghost.output}: step 'ghost' has no output",
            id="no output",
        ),
        pytest.param(
            "x ${steps.fetch.output.missing}",
            "${steps.fetch.output.missing}: steps.fetch.output has no key 'missing'",
            id="a missing key",
        ),
        pytest.param(
            {"deep": ["${steps.fetch.output.items.5.name}"]},
            "${steps.fetch.output.items.5.name}: "
            "steps.fetch.output.items has no index 5 (list of length 2)",
            id="an index out of range",
        ),
        pytest.param(
            "${steps.fetch.output.items.first}",
            "steps.fetch.output.items is a list; 'first' is not an index",
            id="a key used on a list",
        ),
        pytest.param(
            "${steps.text.output.length}",
            "${steps.text.output.length}: steps.text.output is a str value, it has no 'length'",
            id="a path below a scalar",
        ),
        pytest.param(
            "${inputs.nope}",
            "${inputs.nope}: no run input named 'nope' (inputs: cfg, tags, topic)",
            id="a missing run input",
        ),
        pytest.param(
            "${inputs.cfg.width}",
            "${inputs.cfg.width}: inputs.cfg has no key 'width' (object with keys ['depth'])",
            id="a missing key below a run input",
        ),
    ],
)
def test_missing_values_raise_an_error_naming_the_reference(value: Any, fragment: str) -> None:
    with pytest.raises(ReferenceResolutionError) as info:
        resolve(value, OUTPUTS, INPUTS)
    assert fragment in str(info.value)
    assert isinstance(info.value, LookupError)
    assert info.value.reference.startswith("${")


def test_resolve_copies_so_handlers_cannot_change_other_outputs() -> None:
    outputs = {"a": {"list": [1, 2]}}
    value = {"x": "${steps.a.output}", "y": ["${steps.a.output.list}"]}
    resolved = resolve(value, outputs, {})
    resolved["x"]["list"].append(3)
    resolved["y"][0].append(4)
    assert outputs == {"a": {"list": [1, 2]}}
    assert value == {"x": "${steps.a.output}", "y": ["${steps.a.output.list}"]}


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4)
    ),
    max_leaves=20,
)


@given(JSON)
def test_an_exact_reference_returns_any_json_value_unchanged(value: Any) -> None:
    assert resolve("${steps.a.output}", {"a": value}, {}) == value
    assert resolve({"k": ["${inputs.v}"]}, {}, {"v": value}) == {"k": [value]}


def _containers(value: Any) -> list[int]:
    """The ids of every dict and list in ``value``, nested ones included."""
    if isinstance(value, dict):
        return [id(value), *(i for v in value.values() for i in _containers(v))]
    if isinstance(value, list):
        return [id(value), *(i for v in value for i in _containers(v))]
    return []


@given(JSON.filter(lambda v: "${" not in repr(v)))
def test_values_without_references_are_returned_unchanged(value: Any) -> None:
    resolved = resolve(value, {}, {})
    assert resolved == value
    # A copy all the way down: a handler that changes its inputs changes no plan.
    assert not set(_containers(resolved)) & set(_containers(value))
    assert find_step_refs(value) == set()


@given(st.text(alphabet=st.characters(blacklist_characters="$"), max_size=30))
def test_text_around_a_reference_is_kept(text: str) -> None:
    assert resolve(f"{text}${{inputs.v}}{text}", {}, {"v": "X"}) == f"{text}X{text}"
