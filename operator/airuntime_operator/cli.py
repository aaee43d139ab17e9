"""``airt operator``: run the kopf operator (the container image's operator command).

Registered into ``airt`` through the ``airuntime.commands`` entry point; the same as
``python -m airuntime_operator`` (settings from ``AIRUNTIME_*`` environment variables,
see :class:`~airuntime_operator.settings.OperatorSettings`).
"""

from __future__ import annotations

import typer


def operator() -> None:
    """Run the Kubernetes operator (RuntimePool, ScaleOutRequest) until signalled."""
    from airuntime_operator.__main__ import main

    raise typer.Exit(main())


def register(app: typer.Typer) -> None:
    """Entry point of the ``airuntime.commands`` group."""
    app.command("operator")(operator)
