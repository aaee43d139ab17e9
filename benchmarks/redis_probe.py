"""Server-side measurements the benchmarks share: CPU and command counters of a
Redis/Valkey server, ledger stream ids as server time, database URLs.

Why a module of its own: every throughput benchmark reports Redis CPU per step from
``INFO cpu`` deltas and reads durations from server time; one definition keeps the
figures of different benchmarks comparable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import redis

__all__ = ["CLAIM_TYPES", "ServerSample", "celery_url", "entries", "stream_ms", "text", "with_db"]


def with_db(url: str, db: int) -> str:
    """``url`` pointing at database ``db`` (``redis[s]://host/db`` or ``unix://path?db=``)."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        query = [(k, v) for k, v in parse_qsl(parts.query) if k != "db"] + [("db", str(db))]
        return urlunsplit(parts._replace(query=urlencode(query)))
    return urlunsplit(parts._replace(path=f"/{db}"))


def celery_url(url: str, db: int) -> str:
    """:func:`with_db` as Celery's broker and result backend spell it: a unix socket is
    ``redis+socket:///path?virtual_host=db`` there, so the peer takes the same path to
    the server as airuntime."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return f"redis+socket://{parts.path}?virtual_host={db}"
    return with_db(url, db)


@dataclass(frozen=True)
class ServerSample:
    """The server's CPU seconds (user + sys) and commands processed at one moment."""

    cpu_s: float
    commands: int

    @staticmethod
    def take(client: redis.Redis) -> ServerSample:
        cpu = client.info("cpu")
        stats = client.info("stats")
        return ServerSample(
            float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]),
            int(stats["total_commands_processed"]),
        )


def text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


CLAIM_TYPES = frozenset({"steps_claimed", "step_claimed"})
"""Ledger entries that claim steps: a batch's (its ``worker`` the claiming pool) and a
single throttled step's (:mod:`airuntime.engine.ledger_batches`)."""


def stream_ms(entry_id: str) -> int:
    """The server time (ms) in a stream entry id ``<ms>-<seq>``."""
    return int(entry_id.split("-", 1)[0])


def entries(reply: Any) -> list[tuple[str, dict[str, str]]]:
    """``XRANGE``/``XREVRANGE`` reply as ``[(id, fields)]`` with str keys and values."""
    return [(text(i), {text(k): text(v) for k, v in (f or {}).items()}) for i, f in reply or []]
