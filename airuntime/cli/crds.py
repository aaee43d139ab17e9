"""``airt crds``: write the ``airuntime.io`` CRD files, or check that they are current.

Why a command: the CRDs under ``crds/`` (and the Helm chart's copy) are generated from
the models of :mod:`airuntime.k8s.v1alpha1`; whoever changes a model regenerates them
with the same ``airt`` they use for everything else, and CI checks them. The
generator (:mod:`airuntime.k8s.crdgen`) is imported when a command runs, not when
``airt`` starts.

Exit codes: 0 done (or current), 1 ``check`` found missing or stale files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

console = Console(stderr=True, markup=False, soft_wrap=True)
out = Console(markup=False, soft_wrap=True)

crds_app = typer.Typer(
    help="The airuntime.io CustomResourceDefinitions: generate or check the files.",
    no_args_is_help=True,
)


@crds_app.command("generate")
def generate(
    out_dir: Annotated[
        Path,
        typer.Option(
            "--out", help="Directory to (re)write the CRD files into (created if missing)."
        ),
    ],
) -> None:
    """(Re)write every CRD file from the models in airuntime/k8s/v1alpha1.py."""
    from airuntime.k8s.crdgen import write_files

    for path in write_files(out_dir):
        out.print(str(path), highlight=False)


@crds_app.command("check")
def check(
    directory: Annotated[Path, typer.Argument(help="Directory whose CRD files must be current.")],
) -> None:
    """Exit 1 when a CRD file in DIRECTORY is missing or differs from the generator."""
    from airuntime.k8s.crdgen import check_files, stale_message

    stale = check_files(directory)
    for name in stale:
        console.print(stale_message(directory, name), highlight=False)
    if stale:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.add_typer(crds_app, name="crds")
