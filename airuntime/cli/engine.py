"""``airt run``, ``airt worker``, ``airt instances``: the engine and the fleet, seen
from one terminal.

``airt run`` runs a pipeline here, on ``AIRUNTIME_REDIS_URL`` or a private embedded
Valkey; ``airt worker`` joins an execution from another process; ``airt instances``
lists the runtime instances registered on the shared Redis.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from airuntime.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    RedisUrl,
    compile_argument,
    configure_logs_or_exit,
    console,
    handler_policy_or_exit,
    invalid,
    out,
    parse_kv,
    print_table,
    tune_collector_or_exit,
)
from airuntime.cli.listing import (
    Column,
    Interval,
    Output,
    Updates,
    Watch,
    output_format,
    print_listing,
    step_table,
)
from airuntime.core.errors import AirError
from airuntime.core.settings import REDIS_URL_ENV
from airuntime.devstack.process_redis import redis_for_process
from airuntime.engine.execution_store import ExecutionStore
from airuntime.engine.secret_refs import SECRET_NAME_PATTERN
from airuntime.engine.status import ExecutionStatus
from airuntime.engine.store_results import ExecutionInfo
from airuntime.engine.tenant_secrets import value_problem


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
        typer.Option(
            "--redis-url", envvar=REDIS_URL_ENV, help="Redis/Valkey URL (default: embedded)."
        ),
    ] = None,
    secrets: Annotated[
        list[str] | None,
        typer.Option(
            "--secret",
            "-s",
            help="A secret the pipeline's http headers name as ${secrets.NAME}: its value "
            "is the environment variable NAME (kept in memory, never stored).",
        ),
    ] = None,
) -> None:
    """Run PIPELINE end to end and print its steps; exit 0 on success, 1 on failure/cancel."""
    if workers < 1:
        raise invalid(f"--workers: must be >= 1, got {workers}")
    given = secrets_from_environment(secrets or [])
    run_inputs = parse_kv(inputs or [], "--input")
    step_answers = parse_kv(answers or [], "--answer")
    handler_policy_or_exit()
    plan = compile_argument(pipeline)
    unknown = sorted(set(step_answers) - {s.id for s in plan.steps if s.is_input})
    if unknown:
        raise invalid(
            f"--answer: {unknown[0]!r} is not an input step of pipeline {plan.pipeline_id!r}"
        )
    with redis_for_process(redis_url) as url:
        status, snapshot = asyncio.run(
            _run(url, plan, workers, run_inputs, step_answers, as_json, given)
        )
    if as_json:
        out.print_json(json.dumps(snapshot))
    else:
        print_snapshot(snapshot)
    raise typer.Exit(EXIT_OK if status == ExecutionStatus.SUCCEEDED else EXIT_FAILED)


def secrets_from_environment(names: list[str]) -> dict[str, str] | None:
    """``--secret NAME``: the value of the environment variable NAME for each (None when
    no secret was given: the tenant's stored ones are read instead)."""
    if not names:
        return None
    given: dict[str, str] = {}
    for name in names:
        if not re.fullmatch(SECRET_NAME_PATTERN, name):
            raise invalid(
                f"--secret: {name!r} is not a secret name (a letter or _, then letters, "
                "digits or _, at most 64; its value is read from the variable of that name)"
            )
        value = os.environ.get(name)
        if value is None:
            raise invalid(f"--secret: {name} is not set in the environment")
        problem = value_problem(value)
        if problem is not None:
            raise invalid(f"--secret: the value of {name} {problem}")
        given[name] = value
    return given


async def _run(
    url: str,
    plan: Any,
    workers: int,
    run_inputs: dict[str, Any],
    answers: dict[str, Any],
    quiet: bool,
    secrets: dict[str, str] | None = None,
) -> tuple[str, dict[str, Any]]:
    from airuntime.core.redis_client import connect
    from airuntime.engine.local_run import NoInputAvailable, run_plan

    redis = connect(url)
    store = ExecutionStore(redis)
    progress = Progress(
        TextColumn("{task.description}", style="bold", markup=False),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[status]}", markup=False),
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
            hint = f"step {step!r} waits for input; pass --answer {step}=VALUE"
            console.print(hint, style="yellow")
            raise NoInputAvailable("stdin is not a terminal and no --answer was given")
        progress.stop()
        prompt = Text.assemble((step, "bold"), " needs input: ")
        raw = await asyncio.to_thread(console.input, prompt)
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
                secrets=secrets,
            )
    finally:
        await redis.aclose()
    return result.status, result.snapshot


def print_snapshot(snapshot: dict[str, Any]) -> None:
    steps: dict[str, Any] = snapshot.get("steps", {})
    ordered = sorted(steps.items(), key=lambda kv: kv[1].get("claimed_at_ms") or 0)
    print_table(step_table(f"{snapshot.get('pipeline_id')} [{snapshot.get('status')}]", ordered))
    counts = snapshot.get("counts", {})
    out.print(
        f"execution {snapshot.get('execution_id')}: {snapshot.get('status')} "
        f"({counts.get('completed', 0)}/{counts.get('total', 0)} completed, "
        f"{counts.get('failed', 0)} failed, {counts.get('skipped', 0)} skipped, "
        f"{counts.get('cancelled', 0)} cancelled)"
    )


def worker(
    execution_id: Annotated[str, typer.Argument(help="Execution to participate in.")],
    workers: Annotated[
        int, typer.Option("--workers", "-w", help="Worker slots in this process.")
    ] = 4,
    lease_ms: Annotated[int, typer.Option(help="Claim lease in milliseconds.")] = 30_000,
    redis_url: RedisUrl = None,
) -> None:
    """Join EXECUTION_ID from this process until it is finalized (needs a shared Redis)."""
    if not redis_url:
        raise invalid(f"airt worker needs a shared Redis: set {REDIS_URL_ENV} or --redis-url")
    if workers < 1:
        raise invalid(f"--workers: must be >= 1, got {workers}")
    from airuntime.engine.worker_pool import PoolSettings

    try:
        settings = PoolSettings(workers=workers, lease_ms=lease_ms)
    except ValueError as exc:
        raise invalid(str(exc)) from None
    configure_logs_or_exit()
    handler_policy_or_exit()
    tune_collector_or_exit()
    status, stats = asyncio.run(_participate(redis_url, execution_id, settings))
    out.print(json.dumps({"execution_id": execution_id, "status": status, **stats}))
    raise typer.Exit(EXIT_OK if status == ExecutionStatus.SUCCEEDED else EXIT_FAILED)


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
            raise invalid(str(exc)) from None
        return status, {**asdict(pool.stats), "round_trips": redis.round_trips}
    finally:
        await redis.aclose()


def instances(
    tenant: Annotated[
        str | None, typer.Option("--tenant", help="Only instances visible to this tenant.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Same as -o json.")] = False,
    output: Output = None,
    watch: Watch = False,
    interval: Interval = 2.0,
    updates: Updates = None,
    redis_url: RedisUrl = None,
) -> None:
    """List registered runtime instances and their capacity."""
    if not redis_url:
        raise invalid(
            f"airt instances reads the shared registry: set {REDIS_URL_ENV} or --redis-url"
        )
    fmt = output_format(output, as_json)
    url = redis_url

    def fetch() -> tuple[Any, list[Any]]:
        descriptors = asyncio.run(_list_instances(url, tenant))
        return [d.model_dump(mode="json") for d in descriptors], descriptors

    title = f"runtime instances{f' visible to {tenant}' if tenant else ''}"
    caption = "workers: busy/free/all; runs: queued/running"
    print_listing(
        fetch,
        title=title,
        columns=INSTANCE_COLUMNS,
        caption=caption,
        fmt=fmt,
        watch=watch,
        interval=interval,
        updates=updates,
    )


def _accepts(d: Any) -> str:
    c = d.capacity
    return "paused" if c.is_queue_paused else "yes" if c.can_accept_run else "no"


INSTANCE_COLUMNS = (
    Column("instance", lambda d: d.instance_id, is_id=True),
    Column("status", lambda d: d.status.value, no_wrap=True),
    Column("tenant", lambda d: d.tenant_id or "-", is_id=True, shorten=True),
    Column("mode", lambda d: d.isolation_mode.value, no_wrap=True),
    Column("prefix", lambda d: d.runtime_prefix, is_id=True, wide_only=True),
    Column(
        "workers",
        lambda d: (
            f"{d.capacity.active_worker_count}/{d.capacity.available_worker_count}"
            f"/{d.capacity.worker_count}"
        ),
    ),
    Column(
        "runs",
        lambda d: f"{d.capacity.queued_run_count}/{d.capacity.running_run_count}",
    ),
    Column(
        "slots free",
        lambda d: f"{d.capacity.available_run_slots}/{d.capacity.max_concurrent_runs}",
        wide_only=True,
    ),
    Column("accepts", _accepts, no_wrap=True),
    Column("provider", lambda d: d.provider, wide_only=True),
    Column("endpoint", lambda d: d.endpoint or "-", is_id=True, wide_only=True),
    Column("unhealthy loops", lambda d: ", ".join(d.unhealthy_loops) or "-", wide_only=True),
)
"""``airt instances``: the capacity at a glance; ``wide`` adds where and how to reach it."""


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


def register(app: typer.Typer) -> None:
    app.command()(run)
    app.command()(worker)
    app.command()(instances)
