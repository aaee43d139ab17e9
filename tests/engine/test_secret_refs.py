"""``${secrets.NAME}``: where a pipeline may name a secret, what the runtime substitutes,
and the scrubbing of a step's output (:mod:`airuntime.engine.secret_refs`). The API, the
runs and the tenant boundary are covered end to end in
``tests/control_plane/test_secrets.py``."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airuntime.engine.secret_refs import (
    header_templates,
    referenced,
    scrub,
    scrub_value,
    secret_problem,
    substitute,
)


def test_a_header_template_is_substituted_name_by_name() -> None:
    headers = {
        "Authorization": "Bearer ${secrets.TOKEN}",
        "X-Pair": "${secrets.A}:${secrets.B_2}",
        "X-Plain": "no secret",
        "X-Input": "${inputs.x}",
        "X-Mixed": "${secrets.TOKEN}/${inputs.x}",  # refused at submit; never substituted
    }
    inputs = {"url": "https://example.com", "headers": headers}
    templates = header_templates("http", inputs)
    assert templates == {
        "Authorization": "Bearer ${secrets.TOKEN}",
        "X-Pair": "${secrets.A}:${secrets.B_2}",
    }
    assert referenced(templates) == {"TOKEN", "A", "B_2"}
    values = {"TOKEN": "t0k3n", "A": "alpha", "B_2": "beta"}
    assert substitute(templates["X-Pair"], values) == "alpha:beta"
    assert substitute("${secrets.TOKEN}", {"TOKEN": r"a\1$b"}) == r"a\1$b", "values are literal"


@pytest.mark.parametrize("handler", ["echo", "template", "model", "python", "noop"])
def test_no_other_handler_has_anything_substituted(handler: str) -> None:
    assert header_templates(handler, {"headers": {"A": "${secrets.TOKEN}"}}) == {}


@pytest.mark.parametrize(
    ("handler", "loc", "text", "words"),
    [
        ("http", ("headers", "A"), "Bearer ${secrets.TOKEN}", None),
        ("http", ("headers", "A"), "no reference at all", None),
        ("echo", ("value",), "${secrets.TOKEN}", "only in the header values"),
        ("http", ("url",), "https://x/${secrets.TOKEN}", "only in the header values"),
        ("http", ("json", "key"), "${secrets.TOKEN}", "only in the header values"),
        ("http", ("headers", "A", 0), "${secrets.TOKEN}", "only in the header values"),
        ("http", ("headers", "A"), "${secrets.}", "malformed"),
        ("http", ("headers", "A"), "${secrets.TOKEN", "malformed"),
        ("http", ("headers", "A"), "${secrets.9X}", "malformed"),
        ("http", ("headers", "A"), "${secrets.TOKEN} ${secrets}", "malformed"),
        ("http", ("headers", "A"), "${secrets." + "N" * 65 + "}", "malformed"),
        ("http", ("headers", "A"), "${secrets.T} ${steps.a.output}", "cannot also name"),
        ("http", ("headers", "A"), "${inputs.x}${secrets.T}", "cannot also name"),
    ],
)
def test_where_a_secret_may_be_named(
    handler: str, loc: tuple[str | int, ...], text: str, words: str | None
) -> None:
    problem = secret_problem(handler, loc, text)
    if words is None:
        assert problem is None
    else:
        assert problem is not None and words in problem, problem


def test_scrub_replaces_longer_values_first() -> None:
    assert scrub("key=abcdef, part=abc", ["abc", "abcdef"]) == "key=***, part=***"


@pytest.mark.parametrize(
    ("text", "scrubbed"),
    [
        ("HTTP 500: refused Bearer s3cr3t-va", "HTTP 500: refused Bearer ***"),
        ("HTTP 500: refused Bearer s3cr", "HTTP 500: refused Bearer ***"),
        ("HTTP 500: refused Bearer s3c", "HTTP 500: refused Bearer s3c"),  # 3: too short to tell
        ("s3cr3t-value and again s3cr3t-v", "*** and again ***"),
        ("s3cr at the start is not a cut copy", "s3cr at the start is not a cut copy"),
    ],
)
def test_a_copy_cut_short_at_the_end_is_scrubbed(text: str, scrubbed: str) -> None:
    """An error quotes the first 200 characters of a reply: a value it cut in two must
    not leave its first half behind."""
    assert scrub(text, ["s3cr3t-value"]) == scrubbed


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(
    value=JSON,
    secret=st.text(min_size=4, max_size=12).filter(lambda s: s.strip() == s and s != "***"),
    where=st.integers(min_value=0, max_value=3),
)
def test_a_scrubbed_output_is_still_its_json_and_never_holds_the_value(
    value: Any, secret: str, where: int
) -> None:
    """Whatever the output's shape and wherever the value sits in it (a string, a key,
    inside quotes or escapes), the scrubbed output encodes to JSON without the value."""
    planted: Any = [value, {f"h{where}": f"x{secret}y", secret: where}][where % 2 :]
    cleaned = scrub_value(planted, [secret])
    assert json.loads(json.dumps(cleaned)) == cleaned
    assert not [s for s in _strings(cleaned) if secret in s]
    assert "x***y" in _strings(cleaned), "the planted value was scrubbed"


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [t for k, v in value.items() for t in (k, *_strings(v))]
    if isinstance(value, list):
        return [t for v in value for t in _strings(v)]
    return []
