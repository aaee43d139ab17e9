"""``airt operator``: run the kopf operator (the container image's operator command).

Registered into ``airt`` through the ``airuntime.commands`` entry point; the same as
``python -m airuntime_operator`` (settings from ``AIRUNTIME_*`` environment variables,
see :class:`~airuntime_operator.settings.OperatorSettings`). This module imports
neither kopf nor the Kubernetes client, so ``airt`` lists the command in an install
without the ``kubernetes`` extra; running it there says which extra to install.
"""

from __future__ import annotations

import importlib

import typer
from rich.console import Console

#: What the operator needs beyond airuntime's core dependencies, and where it comes from.
EXTRA = "kubernetes"
REQUIRED_MODULES = ("kopf", "kubernetes")


def missing_modules() -> list[str]:
    """The operator's optional dependencies that cannot be imported."""
    missing = []
    for name in REQUIRED_MODULES:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    return missing


def operator() -> None:
    """Run the Kubernetes operator (RuntimePool, ScaleOutRequest) until signalled.

    Needs the kubernetes extra: pip install 'airuntime[kubernetes]'.
    """
    missing = missing_modules()
    if missing:
        Console(stderr=True).print(
            f"error: airt operator needs the {EXTRA!r} extra, which is not installed "
            f"(missing: {', '.join(missing)}): pip install 'airuntime[{EXTRA}]'",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(2)
    from airuntime_operator.__main__ import main

    raise typer.Exit(main())


def register(app: typer.Typer) -> None:
    """Entry point of the ``airuntime.commands`` group."""
    app.command("operator")(operator)
