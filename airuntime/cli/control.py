"""Control-plane commands of ``airt``: ``control-plane``, ``up``, ``submit``, ``drain``,
``runs`` and ``demo``.

``up`` runs everything locally (embedded Valkey + control plane + local scaler + API)
and writes ``$AIRUNTIME_HOME/up.json``; ``submit``/``drain``/``runs`` talk to the API it
serves (or to ``--api``/``AIRUNTIME_API_URL`` with ``--token``/``AIRUNTIME_API_TOKEN``).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
import yaml
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from airuntime.control_plane.rbac import Authenticator
from airuntime.control_plane.settings import ControlPlaneSettings, SubmitMode
from airuntime.core.errors import ConfigError
from airuntime.devstack.embedded import ENV_VAR, redis_for_process
from airuntime.engine.pipeline import PipelineError, load_pipeline

console = Console(stderr=True)
out = Console()

EXIT_OK, EXIT_FAILED = 0, 1


def _invalid(message: str) -> typer.Exit:
    console.print(f"[red]error:[/red] {escape(message)}", highlight=False, soft_wrap=True)
    return typer.Exit(2)


def control_plane(
    host: Annotated[str, typer.Option(envvar="AIRUNTIME_API_HOST")] = "127.0.0.1",
    port: Annotated[int, typer.Option(envvar="AIRUNTIME_API_PORT")] = 8780,
    tokens_file: Annotated[Path | None, typer.Option(envvar="AIRUNTIME_TOKENS_FILE")] = None,
    tenants_file: Annotated[Path | None, typer.Option(envvar="AIRUNTIME_TENANTS_FILE")] = None,
    submit_mode: Annotated[
        SubmitMode, typer.Option(envvar="AIRUNTIME_SUBMIT_MODE")
    ] = SubmitMode.QUEUE_FIRST,
    pump: Annotated[
        bool, typer.Option(envvar="AIRUNTIME_PUMP_ENABLED", help="Allow manual drain.")
    ] = True,
    background_pump: Annotated[bool, typer.Option(envvar="AIRUNTIME_BACKGROUND_PUMP")] = True,
    scale_out: Annotated[bool, typer.Option(envvar="AIRUNTIME_SCALE_OUT_ENABLED")] = True,
    scale_out_provider: Annotated[
        str, typer.Option(envvar="AIRUNTIME_SCALE_OUT_PROVIDER", help="local | kubernetes | none")
    ] = "local",
    namespace: Annotated[
        str | None,
        typer.Option(envvar="AIRUNTIME_NAMESPACE", help="Namespace of ScaleOutRequests."),
    ] = None,
    redis_url: Annotated[str | None, typer.Option("--redis-url", envvar=ENV_VAR)] = None,
) -> None:
    """Run the control plane (API, pump, admission, scale-out) on a shared Redis."""
    from airuntime.devstack.local_stack import load_tenants, serve_control_plane

    if not redis_url:
        raise _invalid(f"airt control-plane needs a shared Redis: set {ENV_VAR} (or use `airt up`)")
    if scale_out_provider not in ("local", "kubernetes", "none"):
        raise _invalid(
            f"--scale-out-provider: expected local, kubernetes or none, got {scale_out_provider!r}"
        )
    try:
        auth = Authenticator.from_file(tokens_file) if tokens_file else None
        tenants = load_tenants(tenants_file) if tenants_file else None
    except ConfigError as exc:
        raise _invalid(str(exc)) from None
    if auth is None:
        raise _invalid(
            "--tokens-file (or AIRUNTIME_TOKENS_FILE) is required: the API needs bearer tokens"
        )
    settings = ControlPlaneSettings(
        submit_mode=submit_mode,
        pump_enabled=pump,
        background_pump=background_pump,
        scale_out_enabled=scale_out,
    )
    provider = None
    if scale_out and scale_out_provider == "kubernetes":
        # ScaleOutRequest resources in `namespace`, fulfilled by the operator.
        try:
            from airuntime.control_plane.scale_out.kubernetes import KubernetesScaleOutProvider

            provider = KubernetesScaleOutProvider(namespace)
        except ImportError as exc:
            raise _invalid(
                f"--scale-out-provider kubernetes needs the kubernetes client "
                f"(pip install 'airuntime[kubernetes]'): {exc}"
            ) from None
    asyncio.run(
        serve_control_plane(
            redis_url,
            host=host,
            port=port,
            settings=settings,
            tenants=tenants,
            auth=auth,
            local_scaler=scale_out_provider == "local",
            scale_out_provider=provider,
        )
    )


def up(
    port: Annotated[int, typer.Option(help="API port (0 = any free port).")] = 8780,
    tenants_file: Annotated[Path | None, typer.Option(envvar="AIRUNTIME_TENANTS_FILE")] = None,
    submit_mode: Annotated[SubmitMode, typer.Option()] = SubmitMode.DIRECT_DISPATCH,
    data_dir: Annotated[
        Path | None, typer.Option(help="Keep Valkey data here (default: ephemeral).")
    ] = None,
    redis_url: Annotated[str | None, typer.Option("--redis-url", envvar=ENV_VAR)] = None,
) -> None:
    """Everything on this machine: embedded Valkey + control plane + local scaler + API."""
    from airuntime.devstack.local_stack import load_tenants, serve_control_plane, state_file

    try:
        tenants = load_tenants(tenants_file)
    except ConfigError as exc:
        raise _invalid(str(exc)) from None
    settings = ControlPlaneSettings(submit_mode=submit_mode)
    state: dict[str, Any] = {}
    options: dict[str, Any] = {"data_dir": data_dir} if data_dir else {}
    with redis_for_process(**options) if not redis_url else _given(redis_url) as url:
        console.print(f"airt up: Redis at {url}; API on 127.0.0.1:{port}; state in {state_file()}")
        asyncio.run(
            serve_control_plane(url, port=port, settings=settings, tenants=tenants, state=state)
        )


class _given:
    def __init__(self, url: str) -> None:
        self.url = url

    def __enter__(self) -> str:
        return self.url

    def __exit__(self, *exc: object) -> None:
        return None


def _client(api: str | None, token: str | None, tenant: str | None) -> tuple[str, str]:
    if api and token:
        return api, token
    from airuntime.devstack.local_stack import read_state

    try:
        state = read_state()
    except ConfigError as exc:
        raise _invalid(str(exc)) from None
    tokens: dict[str, str] = state.get("tokens", {})
    tenant = tenant or "default"
    if tenant not in tokens:
        known = ", ".join(tokens)
        raise _invalid(
            f"--tenant: {tenant!r} is not a tenant of the running stack (known: {known})"
        )
    return api or state["api_url"], token or tokens[tenant]


def _api(method: str, url: str, token: str, *, timeout: float = 60, **kwargs: Any) -> Any:
    """One API call; a 4xx/5xx answer becomes exit 2 with the server's message."""
    try:
        resp = httpx.request(
            method, url, headers={"authorization": f"Bearer {token}"}, timeout=timeout, **kwargs
        )
    except httpx.HTTPError as exc:
        raise _invalid(f"cannot reach the control plane at {url}: {exc}") from None
    if resp.status_code >= 400:
        try:
            detail = resp.json().get("detail", resp.text)
        except ValueError:
            detail = resp.text
        raise _invalid(f"{resp.status_code}: {detail}")
    return resp.json()


def submit(
    pipeline: Annotated[str, typer.Argument(help="Pipeline file, or a packaged example's name.")],
    tenant: Annotated[
        str | None, typer.Option(help="Submit as this tenant (local stack tokens).")
    ] = None,
    wait: Annotated[bool, typer.Option("--wait", help="Follow the run until it ends.")] = False,
    mode: Annotated[SubmitMode | None, typer.Option()] = None,
    inputs: Annotated[list[str] | None, typer.Option("--input", "-i", help="NAME=VALUE")] = None,
    api: Annotated[str | None, typer.Option(envvar="AIRUNTIME_API_URL")] = None,
    token: Annotated[str | None, typer.Option(envvar="AIRUNTIME_API_TOKEN")] = None,
) -> None:
    """Submit PIPELINE to the control plane; with --wait show progress until it ends."""
    doc = _pipeline_document(pipeline)
    values: dict[str, Any] = {}
    for item in inputs or []:
        name, sep, raw = item.partition("=")
        if not sep:
            raise _invalid(f"--input: expected NAME=VALUE, got {item!r}")
        try:
            values[name] = json.loads(raw)
        except json.JSONDecodeError:
            values[name] = raw
    base, tok = _client(api, token, tenant)
    headers = {"authorization": f"Bearer {tok}"}
    body: dict[str, Any] = {"pipeline": doc, "inputs": values}
    if mode is not None:
        body["mode"] = mode.value
    run = _api("POST", f"{base}/v1/runs", tok, json=body)
    console.print(f"submitted {run['shared_run_id']}: {run['status']}")
    if not wait:
        out.print(json.dumps(run))
        return
    final = _follow(base, headers, run["shared_run_id"])
    out.print(json.dumps(final, indent=2))
    status = (final.get("run") or {}).get("status")
    raise typer.Exit(0 if status == "completed" else 1)


def _follow(
    base: str, headers: dict[str, str], srid: str, timeout_s: float = 600
) -> dict[str, Any]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    deadline = time.monotonic() + timeout_s
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[state]}"),
        console=console,
    ) as progress:
        task = progress.add_task(srid, total=None, state="")
        while time.monotonic() < deadline:
            body = httpx.get(f"{base}/v1/runs/{srid}", headers=headers, timeout=30).json()
            run = body.get("run") or {}
            ex = body.get("execution") or {}
            where = body.get("assigned_instance_id") or ""
            state = f"{body.get('status')} {run.get('status', '')} {where}"
            progress.update(
                task, total=ex.get("total"), completed=ex.get("done", 0), state=state.strip()
            )
            if run.get("status") in ("completed", "failed", "cancelled") or body.get("status") in (
                "Rejected",
                "Cancelled",
                "Failed",
            ):
                return dict(body)
            time.sleep(0.2)
    raise _invalid(f"run {srid} did not finish within {timeout_s} s")


def drain(
    max_count: Annotated[int, typer.Option()] = 100,
    tenant: Annotated[str | None, typer.Option()] = None,
    api: Annotated[str | None, typer.Option(envvar="AIRUNTIME_API_URL")] = None,
    token: Annotated[str | None, typer.Option(envvar="AIRUNTIME_API_TOKEN")] = None,
) -> None:
    """Drain the shared queue once (manual pump)."""
    base, tok = _client(api, token, tenant)
    out.print(
        json.dumps(
            _api("POST", f"{base}/v1/queue/drain", tok, json={"max_count": max_count}, timeout=120)
        )
    )


def runs(
    tenant: Annotated[str | None, typer.Option()] = None,
    limit: Annotated[int, typer.Option()] = 50,
    api: Annotated[str | None, typer.Option(envvar="AIRUNTIME_API_URL")] = None,
    token: Annotated[str | None, typer.Option(envvar="AIRUNTIME_API_TOKEN")] = None,
) -> None:
    """List the caller tenant's shared runs."""
    base, tok = _client(api, token, tenant)
    listed = _api("GET", f"{base}/v1/runs", tok, params={"limit": limit}, timeout=30)
    table = Table(title="shared runs")
    for col in ("shared run", "pipeline", "status", "instance", "run id"):
        table.add_column(col, overflow="fold")
    for r in listed:
        table.add_row(
            r["shared_run_id"],
            r["pipeline_id"],
            r["status"],
            r.get("assigned_instance_id") or "-",
            r.get("run_id") or "-",
        )
    out.print(table)


DEMO_TENANTS = (("default", "Shared"), ("tenant-a", "Dedicated"), ("tenant-b", "Hybrid"))


def demo(
    pipeline: Annotated[
        str, typer.Option(help="Pipeline each tenant submits: a file or a packaged example.")
    ] = "summarize-documents",
) -> None:
    """Run `airt up` in the background, submit a pipeline as three tenants (shared,
    dedicated, hybrid), show scale-out happening, and print where each run ran."""
    doc = _pipeline_document(pipeline)
    console.print(
        "[bold]1.[/bold] starting `airt up` (embedded Valkey + control plane + local scaler)"
    )
    proc, state = _start_local_stack()
    try:
        console.print(
            "[bold]2.[/bold] no runtime exists yet; submitting as three tenants (DirectDispatch)"
        )
        submitted = _demo_submit(state, doc)
        console.print(
            "[bold]3.[/bold] scale-out: the local scaler starts one runtime per tenant prefix"
        )
        results = _demo_follow(state, submitted)
    finally:
        console.print("[bold]4.[/bold] stopping `airt up` (Ctrl-C equivalent)")
        _stop_local_stack(proc)
    raise typer.Exit(EXIT_OK if _demo_report(submitted, results) else EXIT_FAILED)


def _start_local_stack() -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    """`airt up` in a private AIRUNTIME_HOME (own embedded Valkey); its state file."""
    home = Path(tempfile.mkdtemp(prefix="airt-demo-"))
    env = {**os.environ, "AIRUNTIME_HOME": str(home), "COLUMNS": "120"}
    env.pop(ENV_VAR, None)
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
            raise _invalid(f"airt up did not start: {err[-2000:]}")
        time.sleep(0.1)
    return proc, json.loads(state_path.read_text())


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
        r = _api(
            "POST", f"{state['api_url']}/v1/runs", state["tokens"][tenant], json={"pipeline": doc}
        )
        submitted[tenant] = r["shared_run_id"]
        console.print(f"   {tenant:9} ({mode:9}) -> {r['shared_run_id']}: {r['status']}")
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
            body = _api(
                "GET", f"{state['api_url']}/v1/runs/{srid}", state["tokens"][tenant], timeout=30
            )
            label = f"{body['status']} {(body.get('run') or {}).get('status', '')}".strip()
            if seen.get(tenant) != label:
                seen[tenant] = label
                console.print(f"   {tenant:9} {label} {body.get('assigned_instance_id') or ''}")
            if (body.get("run") or {}).get("status") in ("completed", "failed", "cancelled"):
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
    out.print(table)
    for tenant, _ in DEMO_TENANTS:
        body = results.get(tenant, {})
        out.print(
            f"{tenant}: shared run {submitted[tenant]}, run {body.get('run_id') or '-'}, "
            f"execution {body.get('execution_id') or '-'}",
            soft_wrap=True,
            highlight=False,
        )
    completed = sum(
        1 for b in results.values() if (b.get("run") or {}).get("status") == "completed"
    )
    ok = completed == len(submitted)
    out.print(
        f"demo: {completed} of {len(submitted)} runs completed, each on its tenant's runtime"
        if ok
        else f"demo: only {completed} of {len(submitted)} runs completed",
        highlight=False,
    )
    return ok


def _pipeline_document(argument: str) -> Any:
    """The pipeline document an argument names (file or packaged example), validated
    locally first so a bad file is reported before anything is sent."""
    from airuntime.examples import pipeline_path

    try:
        with pipeline_path(argument) as path:
            load_pipeline(path)
            return yaml.safe_load(path.read_text())
    except FileNotFoundError as exc:
        raise _invalid(str(exc)) from None
    except PipelineError as exc:
        raise _invalid(str(exc)) from None


def register(app: typer.Typer) -> None:
    app.command("control-plane")(control_plane)
    app.command("up")(up)
    app.command("submit")(submit)
    app.command("drain")(drain)
    app.command("runs")(runs)
    app.command("demo")(demo)
