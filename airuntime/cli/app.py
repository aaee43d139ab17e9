"""The ``airt`` root command: ``--version``, and the command groups put together.

Why this module is small: each command group lives in its own module
(:mod:`~airuntime.cli.engine` ``run``/``worker``/``instances``,
:mod:`~airuntime.cli.server` ``control-plane``, :mod:`~airuntime.cli.client`
``submit``/``drain``, :mod:`~airuntime.cli.run_commands` ``runs ...``,
:mod:`~airuntime.cli.secrets` ``secrets ...``,
:mod:`~airuntime.cli.local` ``up``/``demo``, :mod:`~airuntime.cli.mcp_server` ``mcp``,
:mod:`~airuntime.cli.examples`), with what they share in :mod:`~airuntime.cli.common`.
Deployables that ``airuntime`` must not import (``runtime_pod``, the operator) add
their commands through the ``airuntime.commands`` entry-point group, so the import
direction of docs/architecture.md §4 holds while one ``airt`` serves them all.

Exit codes: 0 success, 1 an execution failed or was cancelled, 2 invalid input
(pipeline file, options, settings).
"""

from __future__ import annotations

import functools
import inspect
from importlib.metadata import entry_points
from typing import Annotated, Any

import typer
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException

from airuntime.cli import (
    client,
    crds,
    engine,
    examples,
    history,
    local,
    mcp_server,
    run_commands,
    secrets,
    server,
)
from airuntime.cli.common import (
    EXIT_FAILED,
    EXIT_INVALID,
    EXIT_OK,
    console,
    error_line,
    invalid,
    out,
)
from airuntime.core.redis_client import RedisUrlError
from airuntime.core.version import installed_version
from airuntime.devstack.embedded import EmbeddedServerLost

app = typer.Typer(
    name="airt",
    help="airuntime: deterministic AI workflow runtime.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _print_version(value: bool) -> None:
    if value:
        out.print(f"airt {installed_version()}", highlight=False)
        raise typer.Exit(EXIT_OK)


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_print_version,
            is_eager=True,
            help="Print the airuntime version and exit.",
        ),
    ] = False,
) -> None:
    """airuntime: deterministic AI workflow runtime."""


@app.command()
def version() -> None:
    """Print the airuntime version."""
    out.print(installed_version())


def _load_plugins() -> None:
    """Add the commands of the ``airuntime.commands`` entry points.

    A plugin that cannot be loaded (a missing optional dependency, a broken install)
    must not take ``airt`` down with it: its command is still listed, and running it
    says what is wrong and exits 2.
    """
    for ep in entry_points(group="airuntime.commands"):
        try:
            register = ep.load()
            register(app)
        except Exception as exc:  # any plugin failure is reported the same way
            _register_broken_plugin(ep.name, exc)


def _register_broken_plugin(name: str, error: Exception) -> None:
    message = f"airt {name} is unavailable: {type(error).__name__}: {error}"

    def unavailable() -> None:
        raise invalid(message)

    unavailable.__doc__ = f"(unavailable: {error})"
    app.command(name, context_settings={"ignore_unknown_options": True})(unavailable)


def _reflowed(doc: str) -> str:
    """Help text from a docstring: paragraphs kept, each one's source line breaks joined.

    Rich help prints a docstring's line breaks as they are, so a summary wrapped at 88
    columns in the source broke mid-sentence in every terminal (``airt --help`` at 80
    columns: "print its" / "steps' outputs"); joined, rich wraps it to the terminal. A
    paragraph with an indented or bulleted line is laid out on purpose and kept."""
    paragraphs = inspect.cleandoc(doc).split("\n\n")
    return "\n\n".join(
        p if any(line[:1].isspace() or line.startswith("- ") for line in p.splitlines())
        else " ".join(p.split())
        for p in paragraphs
    )  # fmt: skip


def _reflow_help(group: typer.Typer) -> None:
    """:func:`_reflowed` on the help of every command and group under ``group``."""
    infos: list[Any] = [*group.registered_commands, group.registered_callback]
    for info in infos:
        if info is None:
            continue
        doc = info.help if isinstance(info.help, str) else None
        doc = doc or (info.callback.__doc__ if info.callback else None)
        if doc:
            info.help = _reflowed(doc)
    for sub in group.registered_groups:
        if sub.typer_instance is not None:
            _reflow_help(sub.typer_instance)


@functools.cache
def assembled() -> typer.Typer:
    """``app`` with every command group and plugin registered and its help reflowed
    (once per process)."""
    for group in (
        engine,
        server,
        local,
        client,
        run_commands,
        secrets,
        examples,
        crds,
        history,
        mcp_server,
    ):
        group.register(app)
    _load_plugins()
    _reflow_help(app)
    return app


def main() -> None:
    try:
        assembled()()
    except RedisUrlError as exc:
        raise SystemExit(_fail(str(exc), EXIT_INVALID)) from None
    except EmbeddedServerLost as exc:
        raise SystemExit(_fail(str(exc), EXIT_FAILED)) from None
    except (RedisConnectionError, RedisClusterException) as exc:
        # Raised out of a command: the Redis it was given does not answer (a bad
        # host, port or password, or a server that is down), not a bug of airt's.
        raise SystemExit(_fail(f"cannot reach Redis: {exc}", EXIT_FAILED)) from None


def _fail(message: str, code: int) -> int:
    console.print(error_line(message), highlight=False)
    return code


if __name__ == "__main__":
    main()
