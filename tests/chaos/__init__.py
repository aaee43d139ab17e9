"""The chaos test: real processes, real faults, and what must hold afterwards.

``effects`` is the handler module its ``python`` steps call
(``AIRUNTIME_PYTHON_HANDLER_MODULES=tests.chaos``); ``cluster`` starts, kills and
restarts the processes (also used by ``benchmarks/recovery.py``).
"""
