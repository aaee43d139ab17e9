"""Loads the Lua scripts, resolves their includes and calls them by EVALSHA.

Scripts live in ``airuntime/lua/<verbNoun>-<numKeys>.lua`` (the BullMQ convention):
the key count in the file name is checked on every call, shared functions live in
``lua/includes/<name>.lua`` and are pulled in with ``--- @include "name"`` (each at
most once per script; cycles are reported with file and line). Every script gets a
first line naming the airuntime version, so two releases sharing one Redis never run
each other's code (their SHAs differ). A server that lost its script cache answers
NOSCRIPT; the script is loaded again and the call retried once. :meth:`ScriptLibrary.call_many`
sends many calls of one script in one round trip (a pipeline, each call still atomic on
its own), which is how the dispatch path batches per-run scripts (:meth:`ScriptLibrary.call_mixed`
of any scripts; :mod:`airuntime.core.script_batching` coalesces lone calls into it);
:meth:`ScriptLibrary.call_in_order` sends calls of different scripts that must run in
a given order (one round trip on a standalone server, one call after the other on a
cluster, where a pipeline to several nodes keeps no order).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from redis.exceptions import NoScriptError, ResponseError

from airuntime.core.errors import ScriptError
from airuntime.core.redis_client import CountingRedis, RedisClient, is_cluster
from airuntime.core.slots import check_script
from airuntime.core.version import installed_version

LUA_DIR = Path(__file__).resolve().parent.parent / "lua"
_NAME = re.compile(r"^(?P<name>[a-z][A-Za-z]+)-(?P<keys>\d+)\.lua$")
_INCLUDE = re.compile(r'^---\s*@include\s+"(?P<name>[A-Za-z0-9_]+)"\s*$')

KeyArg = str | bytes
Arg = str | bytes | int | float


@dataclass(frozen=True, slots=True)
class ScriptCall:
    """One call of a script by name, sent with others (:meth:`ScriptLibrary.call_in_order`)."""

    name: str
    keys: Sequence[KeyArg]
    args: Sequence[Arg] = ()


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

    def checked(self, name: str, keys: Sequence[KeyArg]) -> LuaScript:
        """The script ``name`` after checking a call's keys: their count, one hash slot."""
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
        return await self.send(redis, self.checked(name, keys), keys, args)

    async def send(
        self, redis: RedisClient, script: LuaScript, keys: Sequence[KeyArg], args: Sequence[Arg]
    ) -> Any:
        """:meth:`call` of a call whose keys :meth:`checked` has passed."""
        try:
            return await _evalsha(redis, script, keys, args)
        except NoScriptError:
            await redis.script_load(script.source)
            return await _evalsha(redis, script, keys, args)

    async def call_many(
        self, redis: RedisClient, name: str, calls: Sequence[tuple[Sequence[KeyArg], Sequence[Arg]]]
    ) -> list[Any]:
        """One reply per ``(keys, args)`` call of script ``name``, all sent in one round
        trip (no MULTI: each call is atomic on its own, as with :meth:`call`). A reply that
        is an error is returned as the exception, not raised."""
        return await self.call_mixed(redis, [(name, keys, args) for keys, args in calls])

    async def call_mixed(
        self, redis: RedisClient, calls: Sequence[tuple[str, Sequence[KeyArg], Sequence[Arg]]]
    ) -> list[Any]:
        """:meth:`call_many` of ``(name, keys, args)`` calls of any scripts. After a
        script-cache loss only the calls the server refused are sent again (the others
        ran), once every script is loaded."""
        if not calls:
            return []
        scripts = [self.checked(name, keys) for name, keys, _ in calls]
        sent = [
            (script, keys, args) for script, (_, keys, args) in zip(scripts, calls, strict=True)
        ]
        replies = await self._pipelined(redis, sent)
        missing = [i for i, r in enumerate(replies) if isinstance(r, NoScriptError)]
        if missing:
            if len({sent[i][0].name for i in missing}) == 1:
                await redis.script_load(sent[missing[0]][0].source)
            else:
                await self.load_all(redis)
            again = await self._pipelined(redis, [sent[i] for i in missing])
            for i, reply in zip(missing, again, strict=True):
                replies[i] = reply
        return replies

    async def call_in_order(
        self,
        redis: RedisClient,
        calls: Sequence[ScriptCall],
        then: Sequence[Sequence[KeyArg | Arg]] = (),
    ) -> list[Any]:
        """The replies of ``calls`` and then of the plain commands ``then``, run one
        after the other: in one round trip on a standalone server (a pipeline without
        MULTI: each call atomic on its own, in this order), one call after the other on a
        cluster (a pipeline to several nodes keeps no order). Every call runs; then the
        first error reply is raised.

        After a script-cache loss (a restarted server) the pipelined calls come back
        NOSCRIPT while ``then`` ran: every script of the library is loaded again, the
        refused calls are sent again in order and ``then`` once more after them, so it
        still lands last (``then`` must be safe to repeat: an announcement). A call
        whose script alone was missing (a partly reloaded cache) lands after the calls
        that follow it; callers rely only on repairs that exist anyway for that."""
        if is_cluster(redis):
            replies = [await self._reply_of(redis, c) for c in calls]
            replies += [await _reply_of_command(redis, command) for command in then]
            return raise_first_error(replies)
        scripts = [self.checked(c.name, c.keys) for c in calls]
        commands: list[Sequence[Any]] = [
            ("EVALSHA", script.sha, script.num_keys, *c.keys, *c.args)
            for script, c in zip(scripts, calls, strict=True)
        ]
        replies = await _send_batch(redis, [*commands, *then])
        refused = [i for i, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
        if refused:
            await self.load_all(redis)
            for i in refused:
                replies[i] = await self._reply_of(redis, calls[i])
            for j, command in enumerate(then, start=len(calls)):
                replies[j] = await _reply_of_command(redis, command)
        return raise_first_error(replies)

    async def _reply_of(self, redis: RedisClient, c: ScriptCall) -> Any:
        try:
            return await self.call(redis, c.name, c.keys, c.args)
        except ResponseError as exc:
            return exc

    async def load_all(self, redis: RedisClient) -> None:
        """Load every script of the library in one round trip (on a cluster: on every
        primary), so a lost cache is refilled at once instead of NOSCRIPT by NOSCRIPT."""
        if is_cluster(redis):
            for script in self.scripts.values():
                await redis.script_load(script.source)
            return
        pipe = redis.pipeline(transaction=False)
        for script in self.scripts.values():
            pipe.script_load(script.source)
        await pipe.execute()

    @staticmethod
    async def _pipelined(
        redis: RedisClient,
        calls: Sequence[tuple[LuaScript, Sequence[KeyArg], Sequence[Arg]]],
    ) -> list[Any]:
        # A raw EVALSHA: redis-py's cluster pipeline blocks its evalsha() method (it
        # cannot reload scripts); NOSCRIPT is handled by call_mixed, and the cluster
        # pipeline routes EVALSHA by its first key like any keyed command.
        return await _send_batch(
            redis,
            [("EVALSHA", sc.sha, sc.num_keys, *keys, *args) for sc, keys, args in calls],
        )


async def _send_batch(redis: RedisClient, commands: Sequence[Sequence[Any]]) -> list[Any]:
    """``commands`` in one round trip without MULTI; each reply or its error reply. A
    standalone client of :func:`~airuntime.core.redis_client.connect` sends them without
    a redis-py pipeline (:meth:`CountingRedis.send_batch`); any other client through
    one (a cluster's routes each command to its node)."""
    if isinstance(redis, CountingRedis):
        return await redis.send_batch(commands)
    pipe = redis.pipeline(transaction=False)
    for command in commands:
        pipe.execute_command(*command)
    return list(await pipe.execute(raise_on_error=False))


async def _evalsha(
    redis: RedisClient, script: LuaScript, keys: Sequence[KeyArg], args: Sequence[Arg]
) -> Any:
    """One EVALSHA; its error reply raised, as ``redis.evalsha`` raises it."""
    if isinstance(redis, CountingRedis):
        [reply] = await redis.send_batch([("EVALSHA", script.sha, script.num_keys, *keys, *args)])
        if isinstance(reply, ResponseError):
            raise reply
        return reply
    return await redis.evalsha(script.sha, script.num_keys, *keys, *args)


async def _reply_of_command(redis: RedisClient, command: Sequence[KeyArg | Arg]) -> Any:
    try:
        return await redis.execute_command(*command)
    except ResponseError as exc:
        return exc


def raise_first_error(replies: list[Any]) -> list[Any]:
    """``replies`` if none is an error reply; else the first error, raised."""
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return replies


@cache
def library() -> ScriptLibrary:
    """The package's own scripts (loaded once per process)."""
    return ScriptLibrary()
