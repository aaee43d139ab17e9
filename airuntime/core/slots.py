"""Hash-slot guard: every Lua script call and every MULTI/EXEC touches one slot.

Why this module exists: on a Redis/Valkey Cluster a script or a transaction whose keys
live in more than one hash slot is refused with CROSSSLOT, while a standalone server
runs it without a word. The suite runs on standalone servers, so a key layout mistake
would only show on a cluster. :func:`ensure_single_slot` computes the slots the way
the cluster does (:func:`redis.crc.key_slot`, hash tags included) and refuses a
cross-slot call on any server; :class:`~airuntime.core.scripts.ScriptLibrary` calls
it for every script call and the transaction sites call :func:`ensure_transaction_slot`,
both when :func:`slot_check_enabled` (``AIRUNTIME_SLOT_CHECK=1``, read once per
process; the test suite turns it on for every test).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any, Final

from redis.crc import key_slot

from airuntime.core.errors import ScriptError
from airuntime.core.keys import ExecutionKeys

SLOT_CHECK_ENV: Final = "AIRUNTIME_SLOT_CHECK"

STANDALONE_EXECUTION_PREFIX: Final = ExecutionKeys("").tag.removesuffix("}")
"""``air:{e:``: how the keys of an execution begin in the one-bucket layout of a
standalone server. That layout keeps the pre-cluster key names (no migration) and so
combines ``air:{e:<E>}:*`` with the global indexes ``air:executions*`` and
``air:archive:outbox``; it never reaches a cluster (a cluster always uses 128 buckets,
whose scripts are single-slot, and ``air:execution-layout`` refuses a switch). Script
calls in it are not checked; calls in the bucket layout are, like every other script
(the cluster variants of the engine tests run them on a real cluster)."""


_enabled: bool | None = None
"""The variable as first read (None: not read yet). A process sets the variable before
its first Redis call (the suite's conftest at import; a child inherits it) and does not
change it after, so it is read once: a script call asks a dozen times a run, and an
environment lookup costs as much as the rest of the check."""


def slot_check_enabled() -> bool:
    """Whether script calls and transactions are checked (``AIRUNTIME_SLOT_CHECK=1``,
    read at the first call)."""
    global _enabled
    if _enabled is None:
        _enabled = slot_check_from_environment()
    return _enabled


def slot_check_from_environment() -> bool:
    """What the environment says now (``AIRUNTIME_SLOT_CHECK=1``)."""
    return os.environ.get(SLOT_CHECK_ENV, "") == "1"


def _text(key: str | bytes) -> bytes:
    return key if isinstance(key, bytes) else key.encode()


_STANDALONE_EXECUTION: Final = STANDALONE_EXECUTION_PREFIX.encode()


def slots_of(keys: Iterable[str | bytes]) -> dict[int, list[str]]:
    """The hash slots of ``keys`` (as a cluster computes them), each with its keys."""
    out: dict[int, list[str]] = {}
    for key in keys:
        raw = _text(key)
        out.setdefault(key_slot(raw), []).append(raw.decode(errors="replace"))
    return out


def ensure_single_slot(what: str, keys: Sequence[str | bytes]) -> None:
    """Raise :class:`ScriptError` naming ``what`` and each slot's keys when ``keys``
    span more than one hash slot (a cluster would refuse the call: CROSSSLOT)."""
    slots = slots_of(keys)
    if len(slots) <= 1:
        return
    detail = "; ".join(f"slot {slot}: {', '.join(ks)}" for slot, ks in sorted(slots.items()))
    raise ScriptError(f"{what} touches {len(slots)} hash slots (CROSSSLOT on a cluster): {detail}")


def check_script(name: str, keys: Sequence[str | bytes]) -> None:
    """The guard of one script call, when enabled (the standalone execution layout
    aside: :data:`STANDALONE_EXECUTION_PREFIX`)."""
    if not slot_check_enabled():
        return
    if keys and _text(keys[0]).startswith(_STANDALONE_EXECUTION):
        return
    ensure_single_slot(f"Lua script {name!r}", keys)


_ALL_ARGS_ARE_KEYS: Final = frozenset({"DEL", "UNLINK", "EXISTS", "MGET", "TOUCH", "WATCH"})
_KEY_VALUE_PAIRS: Final = frozenset({"MSET", "MSETNX"})


def command_keys(args: Sequence[Any]) -> list[str | bytes]:
    """The keys of one queued command (what the transaction sites use: the first
    argument, or every argument of the multi-key commands)."""
    name = str(args[0]).upper()
    if name in ("MULTI", "EXEC", "DISCARD", "UNWATCH"):
        return []
    rest = [a if isinstance(a, bytes) else str(a) for a in args[1:]]
    if name in _KEY_VALUE_PAIRS:
        return rest[0::2]
    return rest if name in _ALL_ARGS_ARE_KEYS else rest[:1]


def ensure_transaction_slot(what: str, pipe: Any, *watched: str | bytes) -> None:
    """The guard of one MULTI/EXEC transaction, when enabled: the keys of the commands
    queued on ``pipe`` (a redis-py pipeline, checked just before ``execute``) and the
    ``watched`` keys must be in one hash slot."""
    if not slot_check_enabled():
        return
    stack = getattr(pipe, "command_stack", None)
    if stack is None:  # a cluster client's pipeline: the cluster itself refuses CROSSSLOT
        return
    queued = [k for args, _ in stack for k in command_keys(args)]
    ensure_single_slot(f"transaction {what!r}", [*watched, *queued])
