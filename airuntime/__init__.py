"""airuntime: a deterministic runtime for AI workflows.

Pipelines are DAGs of steps whose state lives in Redis (or Valkey) and changes only
through atomic Lua scripts; any number of asyncio workers, in any number of processes,
advance an execution by claiming ready steps with a claim token and completing them.
"""

__version__ = "0.1.0"
