"""The Lua loader: file-name conventions, headers, includes, versioning, NOSCRIPT."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from redis.asyncio import Redis

from airuntime import __version__
from airuntime.core.errors import ScriptError
from airuntime.core.scripts import LUA_DIR, ScriptLibrary, library, load_script

SCRIPTS = sorted(LUA_DIR.glob("*.lua"))


@pytest.mark.parametrize("path", [pytest.param(p, id=p.name) for p in SCRIPTS])
def test_every_script_documents_its_keys_arguments_and_returns(path: Path) -> None:
    text = path.read_text()
    assert text.startswith("--[["), f"{path.name} must open with a header comment"
    header = text.split("]]", 1)[0]
    body = text.split("]]", 1)[1]
    sections = ["Input:", "KEYS[1", "Output:"] + (["ARGV[1"] if "ARGV[" in body else [])
    for section in sections:
        assert section in header, f"{path.name}: header lacks {section}"
    n = int(re.search(r"-(\d+)\.lua$", path.name).group(1))  # type: ignore[union-attr]
    uses_exec_keys = '--- @include "execKeys"' in body
    highest = max((int(m) for m in re.findall(r"KEYS\[(\d+)\]", body)), default=0)
    assert uses_exec_keys or highest == n, f"{path.name} uses KEYS[{highest}] but is named -{n}"
    if uses_exec_keys:
        assert n == 21


def test_scripts_carry_the_version_so_releases_never_share_a_sha() -> None:
    script = library()["claimSteps"]
    assert script.source.startswith(f"-- airuntime {__version__} claimSteps\n")
    assert "@include" not in script.source, "includes are expanded"


def test_include_cycles_are_reported_with_file_and_line(tmp_path: Path) -> None:
    inc = tmp_path / "includes"
    inc.mkdir()
    (inc / "a.lua").write_text('--- @include "b"\n')
    (inc / "b.lua").write_text('-- b\n--- @include "a"\n')
    (tmp_path / "doThing-1.lua").write_text('--- @include "a"\nreturn 1\n')
    with pytest.raises(ScriptError, match=r"b\.lua:2: include cycle doThing-1 -> a -> b -> a"):
        load_script(tmp_path / "doThing-1.lua")


def test_a_missing_include_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "includes").mkdir()
    (tmp_path / "doThing-1.lua").write_text('\n--- @include "nothere"\n')
    with pytest.raises(ScriptError, match=r"doThing-1\.lua:2: include 'nothere' not found"):
        load_script(tmp_path / "doThing-1.lua")


def test_file_names_must_carry_the_key_count(tmp_path: Path) -> None:
    (tmp_path / "doThing.lua").write_text("return 1\n")
    with pytest.raises(ScriptError, match="<verbNoun>-<numKeys>"):
        ScriptLibrary(tmp_path)


async def test_the_key_count_is_checked_on_every_call(redis: Redis) -> None:
    with pytest.raises(ScriptError, match="takes 1 keys, was called with 2"):
        await library().call(redis, "releaseLease", ["a", "b"], ["h"])


async def test_a_flushed_script_cache_is_reloaded_transparently(redis: Redis) -> None:
    lib = library()
    assert await lib.call(redis, "releaseLease", ["air:{l:x}:holders"], ["h"]) == 0
    await redis.script_flush()
    assert await lib.call(redis, "releaseLease", ["air:{l:x}:holders"], ["h"]) == 0
