"""Loads the Lua scripts, resolves their includes and calls them by EVALSHA.

Scripts live in ``airuntime/lua/<verbNoun>-<numKeys>.lua`` (the BullMQ convention):
the key count in the file name is checked on every call, shared functions live in
``lua/includes/<name>.lua`` and are pulled in with ``--- @include "name"`` (each at
most once per script; cycles are reported with file and line). Every script gets a
first line naming the airuntime version, so two releases sharing one Redis never run
each other's code (their SHAs differ). A server that lost its script cache answers
NOSCRIPT; the script is loaded again and the call retried once. :meth:`ScriptLibrary.call_many`
sends many calls of one script in one round trip (a pipeline, each call still atomic on
its own), which is how the dispatch path batches per-run scripts.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from redis.exceptions import NoScriptError

from airuntime.core.errors import ScriptError
from airuntime.core.redis_client import RedisClient
from airuntime.core.slots import check_script
from airuntime.core.version import installed_version

LUA_DIR = Path(__file__).resolve().parent.parent / "lua"
_NAME = re.compile(r"^(?P<name>[a-z][A-Za-z]+)-(?P<keys>\d+)\.lua$")
_INCLUDE = re.compile(r'^---\s*@include\s+"(?P<name>[A-Za-z0-9_]+)"\s*$')

KeyArg = str | bytes
Arg = str | bytes | int | float


@dataclass(frozen=True, slots=True)
class LuaScript:
    name: str
    num_keys: int
    source: str
    sha: str


def _expand(path: Path, includes_dir: Path, seen: set[str], stack: list[str]) -> list[str]:
    out: list[str] = []
    for lineno, line in enumerate(path.read_text().splitlines(), start=1):
        m = _INCLUDE.match(line)
        if not m:
            out.append(line)
            continue
        name = m.group("name")
        if name in stack:
            chain = " -> ".join([*stack, name])
            raise ScriptError(f"{path.name}:{lineno}: include cycle {chain}")
        if name in seen:
            continue
        target = includes_dir / f"{name}.lua"
        if not target.exists():
            raise ScriptError(f"{path.name}:{lineno}: include {name!r} not found in {includes_dir}")
        seen.add(name)
        out.extend(_expand(target, includes_dir, seen, [*stack, name]))
    return out


def load_script(path: Path) -> LuaScript:
    m = _NAME.match(path.name)
    if not m:
        raise ScriptError(f"Lua script file name {path.name!r} is not <verbNoun>-<numKeys>.lua.")
    name = m.group("name")
    body = "\n".join(_expand(path, path.parent / "includes", set(), [path.stem]))
    source = f"-- airuntime {installed_version()} {name}\n{body}\n"
    sha = hashlib.sha1(source.encode()).hexdigest()
    return LuaScript(name=name, num_keys=int(m.group("keys")), source=source, sha=sha)


class ScriptLibrary:
    """The scripts of one directory, callable by name."""

    def __init__(self, directory: Path = LUA_DIR) -> None:
        self.scripts: dict[str, LuaScript] = {}
        for path in sorted(directory.glob("*.lua")):
            script = load_script(path)
            if script.name in self.scripts:
                raise ScriptError(f"Two Lua scripts are named {script.name!r} in {directory}.")
            self.scripts[script.name] = script

    def __getitem__(self, name: str) -> LuaScript:
        try:
            return self.scripts[name]
        except KeyError:
            raise ScriptError(f"No Lua script named {name!r}.") from None

    def _checked(self, name: str, keys: Sequence[KeyArg]) -> LuaScript:
        script = self[name]
        if len(keys) != script.num_keys:
            raise ScriptError(
                f"Lua script {name!r} takes {script.num_keys} keys, was called with {len(keys)}."
            )
        check_script(name, keys)  # one hash slot per call (airuntime.core.slots)
        return script

    async def call(
        self, redis: RedisClient, name: str, keys: Sequence[KeyArg], args: Sequence[Arg] = ()
    ) -> Any:
        script = self._checked(name, keys)
        try:
            return await redis.evalsha(script.sha, script.num_keys, *keys, *args)
        except NoScriptError:
            await redis.script_load(script.source)
            return await redis.evalsha(script.sha, script.num_keys, *keys, *args)

    async def call_many(
        self, redis: RedisClient, name: str, calls: Sequence[tuple[Sequence[KeyArg], Sequence[Arg]]]
    ) -> list[Any]:
        """One reply per ``(keys, args)`` call of script ``name``, all sent in one round
        trip (no MULTI: each call is atomic on its own, as with :meth:`call`). A reply that
        is an error is returned as the exception, not raised."""
        if not calls:
            return []
        script = self[name]
        for keys, _ in calls:
            self._checked(name, keys)
        replies = await self._pipelined(redis, script, calls)
        missing = [i for i, r in enumerate(replies) if isinstance(r, NoScriptError)]
        if missing:
            # Only the calls the server refused are sent again: the others ran.
            await redis.script_load(script.source)
            again = await self._pipelined(redis, script, [calls[i] for i in missing])
            for i, reply in zip(missing, again, strict=True):
                replies[i] = reply
        return replies

    @staticmethod
    async def _pipelined(
        redis: RedisClient,
        script: LuaScript,
        calls: Sequence[tuple[Sequence[KeyArg], Sequence[Arg]]],
    ) -> list[Any]:
        pipe = redis.pipeline(transaction=False)
        for keys, args in calls:
            # execute_command: redis-py's cluster pipeline blocks its evalsha() method
            # (it cannot reload scripts); NOSCRIPT is handled by call_many, and the
            # cluster pipeline routes EVALSHA by its first key like any keyed command.
            pipe.execute_command("EVALSHA", script.sha, script.num_keys, *keys, *args)
        return list(await pipe.execute(raise_on_error=False))


@cache
def library() -> ScriptLibrary:
    """The package's own scripts (loaded once per process)."""
    return ScriptLibrary()
