"""``airt up`` and ``airt demo``: the whole system on this machine.

``up`` runs everything locally (embedded Valkey + control plane + local scaler + API)
and writes ``$AIRUNTIME_HOME/up.json`` for the clients (:mod:`~airuntime.cli.client`);
``demo`` runs ``up`` in the background, submits a pipeline as three tenants and shows
where each run ran.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from airuntime.cli.client import api_call, finished
from airuntime.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    RedisUrl,
    collector_threshold_or_exit,
    configure_logs_or_exit,
    console,
    handler_policy_or_exit,
    invalid,
    out,
    pipeline_document,
    print_table,
    tune_collector_or_exit,
)
from airuntime.control_plane.settings import (
    ControlPlaneServerSettings,
    ControlPlaneSettings,
    SubmitMode,
)
from airuntime.core.errors import ConfigError
from airuntime.core.settings import HOME_ENV, REDIS_URL_ENV, prepared_home
from airuntime.devstack.process_redis import redis_for_process
from airuntime.fleet.runs import RunStatus


def up(
    port: Annotated[int, typer.Option(help="API port (0 = any free port).")] = 8780,
    tenants_file: Annotated[
        Path | None, typer.Option(envvar=ControlPlaneServerSettings.env_var("tenants_file"))
    ] = None,
    submit_mode: Annotated[SubmitMode, typer.Option()] = SubmitMode.DIRECT_DISPATCH,
    data_dir: Annotated[
        Path | None, typer.Option(help="Keep Valkey data here (default: ephemeral).")
    ] = None,
    redis_url: RedisUrl = None,
) -> None:
    """Everything on this machine: embedded Valkey + control plane + local scaler + API."""
    from airuntime.core.listening import listen_socket
    from airuntime.devstack.local_stack import (
        DEFAULT_TENANTS_SOURCE,
        load_tenants,
        local_secrets_keys,
        running_stack,
        serve_control_plane,
        state_file,
    )

    try:
        tenants = load_tenants(tenants_file)
    except ConfigError as exc:
        raise invalid(str(exc)) from None
    settings = ControlPlaneSettings(submit_mode=submit_mode)
    collector = collector_threshold_or_exit()  # refused before anything is started
    configure_logs_or_exit()
    try:
        prepared_home()  # the state file, logs and default history go there
    except ConfigError as exc:
        raise invalid(str(exc)) from None
    local_secrets_keys()  # kept in the home: tenant secrets are sealed here too
    handler_policy_or_exit()
    running = running_stack()
    if running is not None:
        # One stack a home: a second would replace the first's state file (its tokens
        # and URLs) and remove it on exit, leaving the first unreachable by name.
        raise invalid(
            f"airt up is already running here (pid {running['pid']}, API "
            f"{running.get('api_url')}; state in {state_file()}): stop it first, or start "
            f"this one with another {HOME_ENV}"
        )
    try:
        sock = listen_socket("127.0.0.1", port)
    except ConfigError as exc:
        raise invalid(str(exc)) from None
    state: dict[str, Any] = {}
    options: dict[str, Any] = {"data_dir": data_dir} if data_dir else {}
    with sock, redis_for_process(redis_url, **options) as url:
        api = f"127.0.0.1:{sock.getsockname()[1]}"
        console.print(
            f"airt up: Redis at {url}; API on {api} (console http://{api}/ui); "
            f"state in {state_file()}"
        )
        tune_collector_or_exit(collector)
        try:
            asyncio.run(
                serve_control_plane(
                    url,
                    port=port,
                    settings=settings,
                    tenants=tenants,
                    tenants_source=str(tenants_file or DEFAULT_TENANTS_SOURCE),
                    state=state,
                    sock=sock,
                )
            )
        except ConfigError as exc:
            raise invalid(str(exc)) from None


DEMO_TENANTS = (("default", "Shared"), ("tenant-a", "Dedicated"), ("tenant-b", "Hybrid"))


def demo(
    pipeline: Annotated[
        str, typer.Option(help="Pipeline each tenant submits: a file or a packaged example.")
    ] = "summarize-documents",
) -> None:
    """Run `airt up` in the background, submit a pipeline as three tenants (shared,
    dedicated, hybrid), show scale-out happening, and print where each run ran."""
    doc = pipeline_document(pipeline)
    console.print(
        _stage("1.", "starting `airt up` (embedded Valkey + control plane + local scaler)")
    )
    proc, state, home = _start_local_stack()
    results: dict[str, dict[str, Any]] = {}
    submitted: dict[str, str] = {}
    ok = False
    try:
        console.print(
            _stage("2.", "no runtime exists yet; submitting as three tenants (DirectDispatch)")
        )
        submitted = _demo_submit(state, doc)
        console.print(
            _stage("3.", "scale-out: the local scaler starts one runtime per tenant prefix")
        )
        results = _demo_follow(state, submitted)
    finally:
        console.print(_stage("4.", "stopping `airt up` (Ctrl-C equivalent)"))
        _stop_local_stack(proc)
        # The report's last line says whether the demo worked: it comes last.
        ok = bool(submitted) and _demo_report(submitted, results)
        _leave_home(home, keep=not ok)
    raise typer.Exit(EXIT_OK if ok else EXIT_FAILED)


def _stage(number: str, what: str) -> Text:
    """One of the demo's numbered stages, its number in bold."""
    return Text.assemble((number, "bold"), " ", what)


def _leave_home(home: Path, *, keep: bool) -> None:
    """A demo that worked leaves nothing behind; one that did not keeps its logs and
    history database and says where they are."""
    if keep:
        console.print(f"   the demo's logs and history are kept in {home}")
    else:
        shutil.rmtree(home, ignore_errors=True)


def _start_local_stack() -> tuple[subprocess.Popen[bytes], dict[str, Any], Path]:
    """`airt up` in a private AIRUNTIME_HOME (own embedded Valkey); its state file."""
    home = Path(tempfile.mkdtemp(prefix="airt-demo-"))
    env = {**os.environ, HOME_ENV: str(home), "COLUMNS": "120"}
    env.pop(REDIS_URL_ENV, None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "airuntime.cli", "up", "--port", "0"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    state_path = home / "up.json"
    deadline = time.monotonic() + 60
    while not state_path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            _stop_local_stack(proc)
            err = proc.stderr.read().decode() if proc.stderr else ""
            _leave_home(home, keep=True)
            raise invalid(f"airt up did not start: {err[-2000:]}")
        time.sleep(0.1)
    return proc, json.loads(state_path.read_text()), home


def _stop_local_stack(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _demo_submit(state: dict[str, Any], doc: Any) -> dict[str, str]:
    submitted: dict[str, str] = {}
    for tenant, mode in DEMO_TENANTS:
        r = api_call(
            "POST", f"{state['api_url']}/v1/runs", state["tokens"][tenant], json={"pipeline": doc}
        )
        submitted[tenant] = r["shared_run_id"]
        # One line per run even in an 80-column terminal or a pipe (rich wraps at 80).
        line = f"   {tenant:9} ({mode:9}) -> {r['shared_run_id']}: {r['status']}"
        console.print(line)
    return submitted


def _demo_follow(
    state: dict[str, Any], submitted: dict[str, str], timeout_s: float = 180
) -> dict[str, dict[str, Any]]:
    """Poll each run until it ends, printing every change of its state."""
    results: dict[str, dict[str, Any]] = {}
    seen: dict[str, str] = {}
    deadline = time.monotonic() + timeout_s
    while len(results) < len(submitted) and time.monotonic() < deadline:
        for tenant, srid in submitted.items():
            if tenant in results:
                continue
            body = api_call(
                "GET", f"{state['api_url']}/v1/runs/{srid}", state["tokens"][tenant], timeout=30
            )
            label = f"{body['status']} {(body.get('run') or {}).get('status', '')}".strip()
            if seen.get(tenant) != label:
                seen[tenant] = label
                where = body.get("assigned_instance_id") or ""
                console.print(f"   {tenant:9} {label} {where}".rstrip())
            if finished(body):
                results[tenant] = body
        time.sleep(0.2)
    return results


def _demo_report(submitted: dict[str, str], results: dict[str, dict[str, Any]]) -> bool:
    """Print where each run ran; the last line says whether the demo succeeded."""
    table = Table(title="where each run ran")
    for col in ("tenant", "mode", "runtime instance", "run", "steps"):
        table.add_column(col, no_wrap=True)
    for tenant, mode in DEMO_TENANTS:
        body = results.get(tenant, {})
        ex = body.get("execution") or {}
        table.add_row(
            tenant,
            mode,
            body.get("assigned_instance_id") or "-",
            (body.get("run") or {}).get("status", "unfinished"),
            f"{ex.get('completed', 0)}/{ex.get('total', '?')}",
        )
    print_table(table)
    for tenant, _ in DEMO_TENANTS:
        body = results.get(tenant, {})
        out.print(
            f"{tenant}: shared run {submitted[tenant]}, run {body.get('run_id') or '-'}, "
            f"execution {body.get('execution_id') or '-'}",
            highlight=False,
        )
    completed = sum(
        1 for b in results.values() if (b.get("run") or {}).get("status") == RunStatus.COMPLETED
    )
    ok = completed == len(submitted)
    out.print(
        f"demo: {completed} of {len(submitted)} runs completed, each on its tenant's runtime"
        if ok
        else f"demo: only {completed} of {len(submitted)} runs completed",
        highlight=False,
    )
    return ok


def register(app: typer.Typer) -> None:
    app.command("up")(up)
    app.command("demo")(demo)
