"""The foundation every other part of airuntime stands on, with no domain of its own.

The Redis key schema (:mod:`~airuntime.core.keys`), the Lua script loader
(:mod:`~airuntime.core.scripts`), the exception tree and its Lua return-code table
(:mod:`~airuntime.core.errors`), Redis connections (:mod:`~airuntime.core.redis_client`)
and riding out their transient errors (:mod:`~airuntime.core.transient`), task helpers
(:mod:`~airuntime.core.tasks`), the installed version (:mod:`~airuntime.core.version`)
and the execution context snapshot that carries the tenant boundary on every hop
(:mod:`~airuntime.core.context`).

Layer: imports nothing else of airuntime.
"""
