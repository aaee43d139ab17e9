"""``airt examples``: list the packaged example pipelines, print one, copy them out.

The examples ship inside the package (:mod:`airuntime.examples`), so these commands
work from any directory and in any install; ``airt run <name>`` and
``airt submit <name>`` accept the same names.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from airuntime.cli.common import invalid, out, print_table
from airuntime.examples import all_examples, copy_example, find_example

examples_app = typer.Typer(
    help="The packaged example pipelines: list, show, copy out.", no_args_is_help=True
)


@examples_app.command("list")
def list_examples() -> None:
    """List the packaged examples (name, steps, what each shows)."""
    table = Table(title="packaged example pipelines (airt run <name>)")
    table.add_column("name", no_wrap=True)
    table.add_column("steps", justify="right")
    table.add_column("what it shows")
    for example in all_examples():
        table.add_row(example.name, str(example.steps), example.description)
    print_table(table)


@examples_app.command("show")
def show(name: Annotated[str, typer.Argument(help="Example name (`airt examples list`).")]) -> None:
    """Print an example's YAML."""
    example = find_example(name)
    if example is None:
        raise invalid(_unknown(name))
    out.print(example.text(), end="", highlight=False)


@examples_app.command("copy")
def copy(
    names: Annotated[
        list[str] | None, typer.Argument(help="Examples to copy (default: all of them).")
    ] = None,
    dest: Annotated[
        Path, typer.Option("--to", help="Directory to write them to (created if missing).")
    ] = Path("."),
) -> None:
    """Copy examples out as editable YAML files (never overwrites a file)."""
    chosen = []
    for name in names or [e.name for e in all_examples()]:
        example = find_example(name)
        if example is None:
            raise invalid(_unknown(name))
        chosen.append(example)
    if dest.exists() and not dest.is_dir():
        raise invalid(f"--to: {dest} exists and is not a directory")
    dest.mkdir(parents=True, exist_ok=True)
    for example in chosen:
        try:
            written = copy_example(example, dest)
        except FileExistsError as exc:
            raise invalid(f"{exc} (not overwritten)") from None
        out.print(str(written), highlight=False)


def _unknown(name: str) -> str:
    known = ", ".join(e.name for e in all_examples())
    return f"no packaged example is called {name!r} (examples: {known})"


def register(app: typer.Typer) -> None:
    app.add_typer(examples_app, name="examples")
