"""The Lua loader: file-name conventions, headers, includes, versioning, NOSCRIPT."""

from __future__ import annotations

import re
from pathlib import Path
from unittest.mock import ANY

import pytest
from redis.asyncio import Redis, RedisCluster
from redis.asyncio.cluster import ClusterNode
from redis.exceptions import ResponseError

from airuntime import __version__
from airuntime.core.errors import ScriptError
from airuntime.core.redis_client import RedisClient, is_cluster
from airuntime.core.scripts import LUA_DIR, ScriptCall, ScriptLibrary, library, load_script
from airuntime.engine.execution_store import ExecutionStore

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
    # A script that builds its keys from tags in ARGV declares one key of their slot,
    # which only routes the call (a cluster sends it to the shard of that slot).
    routing_only = n == 1 and highest == 0 and "routes the call" in header
    assert uses_exec_keys or routing_only or highest == n, (
        f"{path.name} uses KEYS[{highest}] but is named -{n}"
    )
    if uses_exec_keys:
        # 21 execution keys; + the active index and the archive outbox for scripts that
        # can finalize; all four indexes (+ the listing index and the early cancels)
        # for the ones that create an execution or keep a cancel for its creation.
        finalizes = '--- @include "finalize"' in body
        expected = 25 if "ek.earlyCancels" in body else 21 + 2 * finalizes
        assert n == expected, f"{path.name} should take {expected} keys"


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


async def test_a_flushed_script_cache_is_reloaded_transparently(engine_redis: RedisClient) -> None:
    redis = engine_redis
    lib = library()
    assert await lib.call(redis, "releaseLease", ["air:{l:x}:holders"], ["h"]) == 0
    await redis.script_flush()
    assert await lib.call(redis, "releaseLease", ["air:{l:x}:holders"], ["h"]) == 0


async def test_pipelined_calls_reload_a_flushed_cache_and_check_every_key_count(
    engine_redis: RedisClient,
) -> None:
    """On a cluster the five keys live on different primaries: one pipeline per node,
    NOSCRIPT from each, the script loaded on every primary, the refused calls resent."""
    redis = engine_redis
    lib = library()
    calls = [([f"air:{{l:{i}}}:holders"], [f"h{i}"]) for i in range(5)]
    await redis.zadd("air:{l:3}:holders", {"h3": 1})
    await redis.script_flush()
    assert await lib.call_many(redis, "releaseLease", calls) == [0, 0, 0, 1, 0]
    assert await redis.zcard("air:{l:3}:holders") == 0
    with pytest.raises(ScriptError, match="takes 1 keys, was called with 2"):
        await lib.call_many(redis, "releaseLease", [*calls, (["a", "b"], ["h"])])
    assert await lib.call_many(redis, "releaseLease", []) == []


async def test_a_cluster_node_that_lost_its_scripts_gets_them_again(
    cluster_redis: RedisCluster,
) -> None:
    """One primary restarted (or promoted) with an empty script cache while the others
    keep theirs: the call routed there answers NOSCRIPT, the script is loaded, the call
    succeeds; the other nodes are not disturbed."""
    lib = library()
    key = "air:{l:one}:holders"
    assert await lib.call(cluster_redis, "releaseLease", [key], ["h"]) == 0
    node = cluster_redis.get_node_from_key(key)
    sha = lib["releaseLease"].sha
    await cluster_redis.execute_command("SCRIPT FLUSH", target_nodes=node)
    assert await _script_on(cluster_redis, node, sha) is False
    await cluster_redis.zadd(key, {"h": 1})
    assert await lib.call(cluster_redis, "releaseLease", [key], ["h"]) == 1
    assert await _script_on(cluster_redis, node, sha) is True
    others = [n for n in cluster_redis.get_primaries() if n.name != node.name]
    assert [await _script_on(cluster_redis, n, sha) for n in others] == [True, True]


async def _script_on(cluster: RedisCluster, node: ClusterNode, sha: str) -> bool:
    (exists,) = await cluster.execute_command("SCRIPT EXISTS", sha, target_nodes=node)
    return bool(exists)


# -- self-contained includes ---------------------------------------------------------------

INCLUDES = sorted((LUA_DIR / "includes").glob("*.lua"))
_INCLUDE_LINE = re.compile(r'^---\s*@include\s+"(\w+)"\s*$', re.M)
_TOP_LEVEL_LOCAL = re.compile(r"^local\s+(?:function\s+)?(\w+)", re.M)


def _code(text: str) -> str:
    """Lua source without string literals and comments."""
    text = re.sub(r"--\[\[.*?\]\]", "", text, flags=re.S)
    text = re.sub(r"'[^'\n]*'", "''", text)
    return re.sub(r"--[^\n]*", "", text)


def _declared(path: Path) -> set[str]:
    """The includes ``path`` pulls in, directly and through their own includes."""
    seen: set[str] = set()
    todo = _INCLUDE_LINE.findall(path.read_text())
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo += _INCLUDE_LINE.findall((LUA_DIR / "includes" / f"{name}.lua").read_text())
    return seen


def _defined_by_includes() -> dict[str, str]:
    """Top-level local name -> the include that defines it."""
    return {
        name: path.stem
        for path in INCLUDES
        for name in _TOP_LEVEL_LOCAL.findall(_code(path.read_text()))
    }


@pytest.mark.parametrize("path", [pytest.param(p, id=p.name) for p in INCLUDES + SCRIPTS])
def test_each_file_declares_the_includes_whose_names_it_uses(path: Path) -> None:
    code = _code(path.read_text())
    own = set(_TOP_LEVEL_LOCAL.findall(code))
    available = _declared(path) | ({path.stem} if path.parent.name == "includes" else set())
    used = set(re.findall(r"(?<![\w.])([A-Za-z_]\w*)", code))
    for name, owner in _defined_by_includes().items():
        if name in used and name not in own:
            assert owner in available, f"{path.name} uses {name} of {owner}.lua undeclared"


@pytest.mark.parametrize("path", [pytest.param(p, id=p.name) for p in INCLUDES])
def test_includes_read_no_keys_or_arguments_of_their_own(path: Path) -> None:
    code = _code(path.read_text())
    assert not re.search(r"\b(KEYS|ARGV)\b", code), f"{path.name} must take keys as parameters"
    assert set(_TOP_LEVEL_LOCAL.findall(code)) <= set(
        re.findall(r"^local\s+function\s+(\w+)", code, re.M)
    ), f"{path.name} defines file-scope locals other than functions"


def test_scripts_that_read_time_use_the_now_ms_include() -> None:
    for path in SCRIPTS + INCLUDES:
        if path.stem != "nowMs":
            assert "'TIME'" not in path.read_text(), f"{path.name} reads TIME itself"


async def test_calls_in_order_keep_their_order_and_every_call_runs_before_an_error_is_raised(
    engine_redis: RedisClient,
) -> None:
    """``call_in_order``: one pipeline on a standalone server, one call after the other
    on a cluster; either way the entries land in the order given, a call that fails does
    not stop the ones after it, and its error is raised once all ran. After a
    script-cache loss the refused calls are sent again in order and the plain commands
    once more after them, so those still land last."""
    redis = engine_redis
    lib = library()
    await lib.load_all(redis)
    ek = ExecutionStore(redis).keys_of("ex-order")  # the layout of this server
    await redis.xadd(ek.events, {"type": "execution_created"})
    await redis.set(ek.meta, "not a hash")  # recordEvent's HMGET on it fails: WRONGTYPE

    def entry(n: int) -> ScriptCall:
        return ScriptCall(
            "recordEvent", [ek.events, ek.meta, ek.bucket.outbox], ["ex-order", "n", n]
        )

    def plain(n: int) -> tuple[str, ...]:
        return ("XADD", ek.events, "*", "n", str(n))

    with pytest.raises(ResponseError, match="WRONGTYPE"):
        await lib.call_in_order(redis, [entry(1), entry(2)], then=[plain(3)])
    await redis.delete(ek.meta)
    await redis.script_flush()
    assert await lib.call_in_order(redis, [entry(4), entry(5)], then=[plain(6)]) == [
        1,
        1,
        ANY,
    ]
    entries = [f[b"n"] for _, f in (await redis.xrange(ek.events))[1:]]
    # A script's writes before its error stay (Redis does not roll a script back).
    if is_cluster(redis):
        assert entries == [b"1", b"2", b"3", b"4", b"5", b"6"]
    else:
        assert entries == [b"1", b"2", b"3", b"6", b"4", b"5", b"6"]
