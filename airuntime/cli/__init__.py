"""The ``airt`` command line: one module per command group, shared helpers in
:mod:`~airuntime.cli.common`.

Deployables that ``airuntime`` must not import (``runtime_pod``, the operator) add their
commands through the ``airuntime.commands`` entry-point group.
"""

from airuntime.cli.app import main

__all__ = ["main"]
