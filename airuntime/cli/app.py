"""The ``airt`` command line.

``airt run`` runs a pipeline here, on ``AIRUNTIME_REDIS_URL`` or a private embedded
Valkey; ``airt worker`` joins an execution from another process. Deployables that
``airuntime`` must not import (``runtime_pod``, the operator) add their commands
through the ``airuntime.commands`` entry-point group, so the import direction of
DESIGN §3 holds while one ``airt`` serves them all.

Exit codes: 0 the execution succeeded, 1 it failed or was cancelled, 2 invalid input
(pipeline file, options, settings).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import Iterator
from importlib.metadata import entry_points
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from airuntime import __version__
from airuntime.core.errors import AirError
from airuntime.devstack.embedded import ENV_VAR, redis_for_process
from airuntime.engine.execution_store import ExecutionInfo, ExecutionStore
from airuntime.engine.pipeline import PipelineError, load_pipeline
from airuntime.engine.pipeline import compile_pipeline as compile_spec
from airuntime.examples import pipeline_path

app = typer.Typer(
    name="airt",
    help="airuntime: deterministic AI workflow runtime.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console(stderr=True)
out = Console()

EXIT_OK, EXIT_FAILED, EXIT_INVALID = 0, 1, 2


def _fail_invalid(message: str) -> typer.Exit:
    console.print(f"[red]error:[/red] {escape(message)}", highlight=False, soft_wrap=True)
    return typer.Exit(EXIT_INVALID)


def _parse_kv(items: list[str], option: str) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for item in items:
        name, sep, raw = item.partition("=")
        if not sep or not name:
            raise _fail_invalid(f"{option}: expected NAME=VALUE, got {item!r}")
        try:
            values[name] = json.loads(raw)
        except json.JSONDecodeError:
            values[name] = raw
    return values


@contextlib.contextmanager
def _redis_url(url: str | None) -> Iterator[str]:
    if url:
        yield url
        return
    with redis_for_process() as resolved:
        yield resolved


def _print_version(value: bool) -> None:
    if value:
        out.print(f"airt {__version__}", highlight=False)
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
    out.print(__version__)


@app.command()
def run(
    pipeline: Annotated[
        str,
        typer.Argument(
            help="Pipeline file (.yaml, .yml or .json), or the name of a packaged example "
            "(`airt examples list`)."
        ),
    ],
    workers: Annotated[
        int, typer.Option("--workers", "-w", help="Worker slots in this process.")
    ] = 4,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the terminal snapshot as JSON.")
    ] = False,
    inputs: Annotated[
        list[str] | None, typer.Option("--input", "-i", help="Run input NAME=VALUE (JSON or text).")
    ] = None,
    answers: Annotated[
        list[str] | None,
        typer.Option(
            "--answer", "-a", help="Value for an `input` step: STEP=VALUE (JSON or text)."
        ),
    ] = None,
    redis_url: Annotated[
        str | None,
        typer.Option("--redis-url", envvar=ENV_VAR, help="Redis/Valkey URL (default: embedded)."),
    ] = None,
) -> None:
    """Run PIPELINE end to end and print its steps; exit 0 on success, 1 on failure/cancel."""
    if workers < 1:
        raise _fail_invalid(f"--workers: must be >= 1, got {workers}")
    run_inputs = _parse_kv(inputs or [], "--input")
    step_answers = _parse_kv(answers or [], "--answer")
    try:
        with pipeline_path(pipeline) as path:
            spec = load_pipeline(path)
        plan = compile_spec(spec)
    except FileNotFoundError as exc:
        raise _fail_invalid(str(exc)) from None
    except PipelineError as exc:
        raise _fail_invalid(str(exc)) from None
    unknown = sorted(set(step_answers) - {s.id for s in plan.steps if s.is_input})
    if unknown:
        raise _fail_invalid(
            f"--answer: {unknown[0]!r} is not an input step of pipeline {plan.pipeline_id!r}"
        )
    with _redis_url(redis_url) as url:
        status, snapshot = asyncio.run(_run(url, plan, workers, run_inputs, step_answers, as_json))
    if as_json:
        out.print_json(json.dumps(snapshot))
    else:
        _print_table(snapshot)
    raise typer.Exit(EXIT_OK if status == "Succeeded" else EXIT_FAILED)


async def _run(
    url: str,
    plan: Any,
    workers: int,
    run_inputs: dict[str, Any],
    answers: dict[str, Any],
    quiet: bool,
) -> tuple[str, dict[str, Any]]:
    from airuntime.core.redis_client import connect
    from airuntime.engine.local_run import NoInputAvailable, run_plan

    redis = connect(url)
    store = ExecutionStore(redis)
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
        console=console,
        disable=quiet or not console.is_terminal,
        transient=False,
    )
    task = progress.add_task(plan.pipeline_id, total=len(plan.steps), status="Creating")

    def on_progress(info: ExecutionInfo) -> None:
        progress.update(task, completed=info.done, status=info.status)

    async def on_input(eid: str, step: str) -> Any:
        if step in answers:
            return answers[step]
        if not sys.stdin.isatty():
            console.print(
                f"[yellow]step {step!r} waits for input; pass --answer {step}=VALUE[/yellow]"
            )
            raise NoInputAvailable("stdin is not a terminal and no --answer was given")
        progress.stop()
        raw = await asyncio.to_thread(console.input, f"[bold]{step}[/bold] needs input: ")
        progress.start()
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return raw

    try:
        with progress:
            result = await run_plan(
                store,
                plan,
                workers=workers,
                inputs=run_inputs,
                on_progress=on_progress,
                on_input=on_input,
            )
    finally:
        await redis.aclose()
    return result.status, result.snapshot


def _print_table(snapshot: dict[str, Any]) -> None:
    steps: dict[str, Any] = snapshot.get("steps", {})
    table = Table(title=f"{snapshot.get('pipeline_id')} [{snapshot.get('status')}]")
    for col in ("step", "status", "attempts", "duration", "output / error"):
        table.add_column(col)
    for sid, st in sorted(steps.items(), key=lambda kv: kv[1].get("claimed_at_ms") or 0):
        dur = ""
        if st.get("claimed_at_ms") and st.get("finished_at_ms"):
            dur = f"{(st['finished_at_ms'] - st['claimed_at_ms']) / 1000:.3f}s"
        shown = (
            st.get("error") if st.get("error") and st["status"] != "completed" else st.get("output")
        )
        text = json.dumps(shown) if not isinstance(shown, str) else shown
        if len(text) > 60:
            text = text[:57] + "..."
        table.add_row(sid, st["status"], str(st.get("attempts", 1)), dur, text)
    out.print(table)
    counts = snapshot.get("counts", {})
    out.print(
        f"execution {snapshot.get('execution_id')}: {snapshot.get('status')} "
        f"({counts.get('completed', 0)}/{counts.get('total', 0)} completed, "
        f"{counts.get('failed', 0)} failed, {counts.get('skipped', 0)} skipped, "
        f"{counts.get('cancelled', 0)} cancelled)"
    )


@app.command()
def worker(
    execution_id: Annotated[str, typer.Argument(help="Execution to participate in.")],
    workers: Annotated[
        int, typer.Option("--workers", "-w", help="Worker slots in this process.")
    ] = 4,
    lease_ms: Annotated[int, typer.Option(help="Claim lease in milliseconds.")] = 30_000,
    redis_url: Annotated[str | None, typer.Option("--redis-url", envvar=ENV_VAR)] = None,
) -> None:
    """Join EXECUTION_ID from this process until it is finalized (needs a shared Redis)."""
    if not redis_url:
        raise _fail_invalid(f"airt worker needs a shared Redis: set {ENV_VAR} or --redis-url")
    if workers < 1:
        raise _fail_invalid(f"--workers: must be >= 1, got {workers}")
    from airuntime.engine.worker_pool import PoolSettings

    try:
        settings = PoolSettings(workers=workers, lease_ms=lease_ms)
    except ValueError as exc:
        raise _fail_invalid(str(exc)) from None
    status, stats = asyncio.run(_participate(redis_url, execution_id, settings))
    out.print(json.dumps({"execution_id": execution_id, "status": status, **stats}))
    raise typer.Exit(EXIT_OK if status == "Succeeded" else EXIT_FAILED)


async def _participate(url: str, execution_id: str, settings: Any) -> tuple[str, dict[str, Any]]:
    import os
    from dataclasses import asdict

    from airuntime.core.redis_client import connect
    from airuntime.engine.worker_pool import WorkerPool

    redis = connect(url, client_name=f"airt-worker:{os.getpid()}")
    try:
        pool = WorkerPool(ExecutionStore(redis), settings=settings)
        try:
            status = await pool.run(execution_id)
        except AirError as exc:
            console.print(f"[red]error:[/red] {exc}")
            raise typer.Exit(EXIT_INVALID) from None
        return status, {**asdict(pool.stats), "round_trips": redis.round_trips}
    finally:
        await redis.aclose()


@app.command()
def instances(
    tenant: Annotated[
        str | None, typer.Option("--tenant", help="Only instances visible to this tenant.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print descriptors as JSON.")] = False,
    redis_url: Annotated[str | None, typer.Option("--redis-url", envvar=ENV_VAR)] = None,
) -> None:
    """List registered runtime instances and their capacity."""
    if not redis_url:
        raise _fail_invalid(
            f"airt instances reads the shared registry: set {ENV_VAR} or --redis-url"
        )
    descriptors = asyncio.run(_list_instances(redis_url, tenant))
    if as_json:
        out.print_json(json.dumps([d.model_dump(mode="json") for d in descriptors]))
        return
    table = Table(title=f"runtime instances{f' visible to {tenant}' if tenant else ''}")
    for col in ("instance", "status", "tenant/mode/prefix", "workers", "runs", "accepts"):
        table.add_column(col, overflow="fold")
    for d in descriptors:
        c = d.capacity
        table.add_row(
            d.instance_id,
            d.status.value,
            f"{d.tenant_id or '-'} {d.isolation_mode.value} {d.runtime_prefix}",
            f"{c.active_worker_count} busy, {c.available_worker_count} free of {c.worker_count}"
            f" (max {c.max_local_workers_per_execution}/execution)",
            f"{c.queued_run_count} queued (cap {c.queue_capacity}), {c.running_run_count} running,"
            f" {c.available_run_slots}/{c.max_concurrent_runs} slots free",
            ("paused" if c.is_queue_paused else "yes" if c.can_accept_run else "no")
            + f" via {d.provider}",
        )
    out.print(table)


async def _list_instances(url: str, tenant: str | None) -> list[Any]:
    from airuntime.core.redis_client import connect
    from airuntime.fleet.registry import Registry

    redis = connect(url)
    try:
        registry = Registry(redis)
        if tenant:
            return await registry.list_visible(await registry.tenant(tenant))
        return await registry.list_all()
    finally:
        await redis.aclose()


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
        raise _fail_invalid(message)

    unavailable.__doc__ = f"(unavailable: {error})"
    app.command(name, context_settings={"ignore_unknown_options": True})(unavailable)


def main() -> None:
    from airuntime.cli import control as cli_control
    from airuntime.cli import crds as cli_crds
    from airuntime.cli import examples as cli_examples

    cli_control.register(app)
    cli_crds.register(app)
    cli_examples.register(app)
    _load_plugins()
    app()


if __name__ == "__main__":
    main()
