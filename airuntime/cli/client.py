"""``airt submit``, ``airt drain``, ``airt queue``: clients of a control plane's API
(``airt runs`` is :mod:`~airuntime.cli.run_commands`).

They talk to the stack ``airt up`` runs (found through its state file,
``$AIRUNTIME_HOME/up.json``, with the development token of ``--tenant``) or to
``--api``/``AIRUNTIME_API_URL`` with ``--token``/``AIRUNTIME_API_TOKEN``.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from typing import Annotated, Any

import httpx
import typer

from airuntime.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    console,
    invalid,
    out,
    parse_kv,
    pipeline_document,
)
from airuntime.cli.listing import (
    Column,
    Interval,
    Output,
    Updates,
    Watch,
    local_time,
    output_format,
    print_listing,
)
from airuntime.control_plane.settings import SubmitMode
from airuntime.control_plane.shared_runs import SHARED_RUN_ID_PATTERN, SharedRunStatus
from airuntime.control_plane.submit_idempotency import IDEMPOTENCY_KEY_PATTERN
from airuntime.core.errors import ConfigError
from airuntime.core.settings import env_name
from airuntime.fleet.runs import RunStatus

_Api = Annotated[str | None, typer.Option(envvar=env_name("api_url"))]
_Token = Annotated[str | None, typer.Option(envvar=env_name("api_token"))]

_FINISHED_RUN = frozenset(s.value for s in RunStatus if s.terminal)
"""Run states after which a run changes no more."""
_FINISHED_SHARED_RUN = frozenset(
    s.value for s in (SharedRunStatus.REJECTED, SharedRunStatus.CANCELLED, SharedRunStatus.FAILED)
)
"""Shared-run states in which no runtime run will ever start."""


UNAVAILABLE = frozenset({502, 503, 504})
"""Answers of a control plane that is starting, stopping or without Redis: try again."""
SUBMIT_RETRY_FOR_S: float = 60.0
"""How long ``airt submit`` sends its request again (same idempotency key) while the
control plane is unavailable or the connection breaks after the request left."""
SUBMIT_CONNECT_FOR_S: float = 5.0
"""How long it tries again while the control plane refuses connections (nothing was
sent; beyond a restart's few seconds it is an address that is wrong)."""


def new_idempotency_key() -> str:
    """A key of this command's own: its retries are one run; another command, another."""
    return f"airt-{uuid.uuid4().hex}"


def create_request(url: str, token: str, key: str, body: dict[str, Any] | None = None) -> Any:
    """A ``POST`` that creates a run (submit, replay) with ``Idempotency-Key: key``, sent
    again (the same key: never a second run) after a broken connection, a timeout or a
    502/503/504, for :data:`SUBMIT_RETRY_FOR_S` (:data:`SUBMIT_CONNECT_FOR_S` while
    connections are refused); another 4xx/5xx is exit 2 with the server's message."""
    headers = {"authorization": f"Bearer {token}", "idempotency-key": key}
    started = time.monotonic()
    delay = 0.2
    while True:
        budget = SUBMIT_RETRY_FOR_S
        try:
            resp = httpx.post(url, json=body, headers=headers, timeout=60)
        except httpx.TransportError as exc:
            problem = f"cannot reach the control plane at {url}: {exc}"
            if isinstance(exc, httpx.ConnectError):
                budget = SUBMIT_CONNECT_FOR_S
        else:
            if resp.status_code < 400:
                return resp.json()
            problem = f"{resp.status_code}: {detail_text(error_detail(resp))}"
            if resp.status_code not in UNAVAILABLE:
                raise invalid(problem)
        if time.monotonic() - started + delay > budget:
            raise invalid(f"{problem} (tried for {time.monotonic() - started:.0f} s)")
        console.print(f"{problem}; sending it again (idempotency key {key})", highlight=False)
        time.sleep(delay)
        delay = min(delay * 2, 5.0)


def api_call(
    method: str,
    url: str,
    token: str,
    *,
    timeout: float = 60,
    expect_body: bool = True,
    **kwargs: Any,
) -> Any:
    """One API call; a 4xx/5xx answer becomes exit 2 with the server's message (None
    for an answer without a body: ``expect_body=False``)."""
    try:
        resp = httpx.request(
            method, url, headers={"authorization": f"Bearer {token}"}, timeout=timeout, **kwargs
        )
    except httpx.HTTPError as exc:
        raise invalid(f"cannot reach the control plane at {url}: {exc}") from None
    if resp.status_code >= 400:
        raise invalid(f"{resp.status_code}: {detail_text(error_detail(resp))}")
    return resp.json() if expect_body else None


def error_detail(resp: httpx.Response) -> Any:
    """An error answer's ``detail`` (FastAPI's), else its text (read ``resp`` first
    when it is a stream)."""
    try:
        body = resp.json()
    except ValueError:
        return resp.text
    return body.get("detail", resp.text) if isinstance(body, dict) else resp.text


_REQUEST_PARTS = frozenset({"body", "path", "query", "header", "cookie"})
_SHOWN_VALUE = 80
"""At most this many characters of a refused value are echoed (a whole pipeline can be
the value of a rule on the request body)."""


def detail_text(detail: Any) -> str:
    """An error answer's ``detail`` as a person reads it. A list of validation errors
    (the API's 422 shape: ``loc``, ``msg``, ``input``) becomes ``<where>: <what is
    wrong> (value=<value>)`` per error, ``; ``-joined -- the wording of every local
    refusal (:func:`airuntime.core.validation.format_validation_error`) -- with the
    request part (``body``, ``path``...) left out of ``<where>``; anything else is
    shown as it came."""
    if not (isinstance(detail, list) and detail):
        return str(detail)
    if not all(isinstance(e, dict) and "msg" in e for e in detail):
        return str(detail)
    parts = []
    for e in detail:
        loc = [str(p) for p in e.get("loc") or ()]
        if loc and loc[0] in _REQUEST_PARTS:
            loc = loc[1:]
        where = ".".join(loc)
        text = f"{where}: {e['msg']}" if where else str(e["msg"])
        if where and "input" in e:
            shown = repr(e["input"])
            if len(shown) > _SHOWN_VALUE:
                shown = shown[: _SHOWN_VALUE - 3] + "..."
            text += f" (value={shown})"
        parts.append(text)
    return "; ".join(parts)


def shared_run_id(value: str) -> str:
    """The ``SRID`` argument's check (a typer callback): anything but a SharedRunId is
    refused here, naming the value, before it is put in a URL path (where ``..`` or
    ``/`` would address another path than the one the user named)."""
    if re.fullmatch(SHARED_RUN_ID_PATTERN, value) is None:
        raise typer.BadParameter(f"{value!r} is not a shared run id (sr- and 32 hex digits)")
    return value


def _client(api: str | None, token: str | None, tenant: str | None) -> tuple[str, str]:
    """The API URL and token: the given ones, else the local stack's for ``tenant``."""
    if api and token:
        return api, token
    from airuntime.devstack.local_stack import read_state

    try:
        state = read_state()
    except ConfigError as exc:
        raise invalid(str(exc)) from None
    tokens: dict[str, str] = state.get("tokens", {})
    tenant = tenant or "default"
    if tenant not in tokens:
        known = ", ".join(tokens)
        raise invalid(f"--tenant: {tenant!r} is not a tenant of the running stack (known: {known})")
    return api or state["api_url"], token or tokens[tenant]


def tenant_target(api: str | None, token: str | None, tenant: str | None) -> tuple[str, str, str]:
    """The API URL, the token and the tenant a per-tenant command acts on: ``--tenant``
    (required with --api/--token, whose token does not say it here), else the local
    stack's ``default``."""
    if api and token and not tenant:
        raise invalid("--tenant: name the tenant to act on")
    base, tok = _client(api, token, tenant)
    return base, tok, tenant or "default"


def submit(
    pipeline: Annotated[str, typer.Argument(help="Pipeline file, or a packaged example's name.")],
    tenant: Annotated[
        str | None, typer.Option(help="Submit as this tenant (local stack tokens).")
    ] = None,
    wait: Annotated[
        bool, typer.Option("--wait", help="Follow the run until it ends; print its outputs.")
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", help="With --wait: the terminal snapshot as JSON.")
    ] = False,
    mode: Annotated[SubmitMode | None, typer.Option()] = None,
    inputs: Annotated[list[str] | None, typer.Option("--input", "-i", help="NAME=VALUE")] = None,
    idempotency_key: Annotated[
        str | None,
        typer.Option(
            help="Submitting again with this key (and the same request) answers with the "
            "run it created instead of making another, for 24 h. Default: a new key each "
            "time, which still makes this command's own retries safe.",
        ),
    ] = None,
    api: _Api = None,
    token: _Token = None,
) -> None:
    """Submit PIPELINE to the control plane; with --wait follow it until it ends, print its
    steps' outputs and exit like ``airt run`` (0 succeeded, 1 failed or cancelled). A
    broken connection or an unavailable control plane is retried with the same
    idempotency key: one run, however often the request is sent."""
    body: dict[str, Any] = {
        "pipeline": pipeline_document(pipeline),
        "inputs": parse_kv(inputs or [], "--input"),
    }
    if mode is not None:
        body["mode"] = mode.value
    if idempotency_key is not None and not re.fullmatch(IDEMPOTENCY_KEY_PATTERN, idempotency_key):
        raise invalid(
            f"--idempotency-key: {idempotency_key!r} is not 1-255 visible ASCII characters"
        )
    base, tok = _client(api, token, tenant)
    run = create_request(f"{base}/v1/runs", tok, idempotency_key or new_idempotency_key(), body)
    replayed = " (the run this idempotency key created)" if run.get("replayed") else ""
    console.print(f"submitted {run['shared_run_id']}: {run['status']}{replayed}")
    if not wait:
        out.print(json.dumps(run))
        return
    final = _follow(base, tok, run["shared_run_id"])
    snapshot = (final.get("execution") or {}).get("snapshot")
    if snapshot is None:  # refused or cancelled before any execution existed
        out.print(json.dumps(final, indent=2))
    elif as_json:
        out.print_json(json.dumps(snapshot))
    else:
        from airuntime.cli.engine import print_snapshot

        print_snapshot(snapshot)
    succeeded = snapshot is not None and snapshot.get("status") == "Succeeded"
    raise typer.Exit(EXIT_OK if succeeded else EXIT_FAILED)


def finished(body: dict[str, Any]) -> bool:
    """Whether a shared run's API answer says it changes no more."""
    return (body.get("run") or {}).get("status") in _FINISHED_RUN


def _follow(base: str, token: str, srid: str, timeout_s: float = 600) -> dict[str, Any]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    deadline = time.monotonic() + timeout_s
    with Progress(
        TextColumn("{task.description}", markup=False),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[state]}", markup=False),
        console=console,
    ) as progress:
        task = progress.add_task(srid, total=None, state="")
        while time.monotonic() < deadline:
            body = api_call("GET", f"{base}/v1/runs/{srid}", token, timeout=30)
            run = body.get("run") or {}
            ex = body.get("execution") or {}
            where = body.get("assigned_instance_id") or ""
            state = f"{body.get('status')} {run.get('status', '')} {where}"
            progress.update(
                task, total=ex.get("total"), completed=ex.get("done", 0), state=state.strip()
            )
            if finished(body) or body.get("status") in _FINISHED_SHARED_RUN:
                return dict(body)
            time.sleep(0.2)
    raise invalid(f"run {srid} did not finish within {timeout_s} s")


def drain(
    max_count: Annotated[int, typer.Option(min=1, max=100_000)] = 100,
    batch: Annotated[
        int, typer.Option(min=1, max=1000, help="Items per drain call (progress steps).")
    ] = 10,
    stop_on_failure: Annotated[
        bool, typer.Option("--stop-on-failure", help="Stop at the first failed dispatch.")
    ] = False,
    tenant: Annotated[str | None, typer.Option()] = None,
    api: _Api = None,
    token: _Token = None,
) -> None:
    """Drain the shared queue (manual pump) up to MAX_COUNT items, in batches, with a
    progress bar on stderr; prints the totals as JSON."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    base, tok = _client(api, token, tenant)
    pending = int(api_call("GET", f"{base}/v1/queue", tok, timeout=30)["pending"])
    totals: dict[str, Any] = {"dispatched": 0, "failed": 0, "cycles": 0, "stopped": "empty"}
    started = time.perf_counter()
    with Progress(
        TextColumn("drain"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[state]}", markup=False),
        console=console,
        transient=True,
    ) as progress:
        task = progress.add_task("drain", total=min(max_count, pending) or None, state="")
        while True:
            left = max_count - totals["dispatched"] - totals["failed"]
            body = {"max_count": min(batch, left), "stop_on_failure": stop_on_failure}
            step = api_call("POST", f"{base}/v1/queue/drain", tok, json=body, timeout=120)
            for k in ("dispatched", "failed", "cycles"):
                totals[k] += step[k]
            totals["stopped"] = step["stopped"]
            progress.update(
                task,
                completed=totals["dispatched"] + totals["failed"],
                state=f"{totals['dispatched']} dispatched, {totals['failed']} failed",
            )
            if step["stopped"] != "max_count" or left <= batch:
                break
    totals["seconds"] = round(time.perf_counter() - started, 4)
    out.print(json.dumps(totals))


def queue(
    tenant: Annotated[
        str | None, typer.Option(help="Act as this tenant (local stack tokens).")
    ] = None,
    output: Output = None,
    watch: Watch = False,
    interval: Interval = 2.0,
    updates: Updates = None,
    api: _Api = None,
    token: _Token = None,
) -> None:
    """Pending shared-queue items per tenant (the caller's tenant; every tenant for an
    admin)."""
    fmt = output_format(output, False)
    base, tok = _client(api, token, tenant)

    def fetch() -> tuple[Any, list[Any]]:
        body = api_call("GET", f"{base}/v1/queue", tok, timeout=30)
        return body, sorted(body["pending_by_tenant"].items())

    print_listing(
        fetch,
        title="shared queue (pending)",
        columns=QUEUE_COLUMNS,
        fmt=fmt,
        watch=watch,
        interval=interval,
        updates=updates,
    )


QUEUE_COLUMNS = (
    Column("tenant", lambda row: row[0], is_id=True),
    Column("pending", lambda row: str(row[1])),
)


def models(
    tenant: Annotated[
        str | None, typer.Option(help="Act as this tenant (local stack tokens).")
    ] = None,
    output: Output = None,
    api: _Api = None,
    token: _Token = None,
) -> None:
    """The model providers the caller's tenant may name in `model` steps: name, API,
    the models a step may ask for (any when none are listed), the most max_tokens."""
    fmt = output_format(output, False)
    base, tok = _client(api, token, tenant)

    def fetch() -> tuple[Any, list[Any]]:
        body = api_call("GET", f"{base}/v1/model-providers", tok, timeout=30)
        return body, body

    print_listing(fetch, title="model providers", columns=MODEL_COLUMNS, fmt=fmt)


MODEL_COLUMNS = (
    Column("provider", lambda p: p["name"], is_id=True),
    Column("api", lambda p: p["api"], no_wrap=True),
    Column("models", lambda p: ", ".join(p["models"]) or "any"),
    Column("max tokens", lambda p: f"{p['max_output_tokens']:,}", no_wrap=True),
)


def usage(
    tenant: Annotated[
        str | None,
        typer.Option(
            help="Whose budget: this tenant (and, on the local stack, its token). Default: "
            "the local stack's 'default'; required with --api/--token."
        ),
    ] = None,
    output: Output = None,
    watch: Watch = False,
    interval: Interval = 2.0,
    updates: Updates = None,
    api: _Api = None,
    token: _Token = None,
) -> None:
    """The tenant's model token budget in its current window: tokens used, held by
    model calls going on, remaining, and when it renews ("not limited" without one)."""
    fmt = output_format(output, False)
    base, tok, who = tenant_target(api, token, tenant)

    def fetch() -> tuple[Any, list[Any]]:
        body = api_call("GET", f"{base}/v1/tenants/{who}/model-usage", tok, timeout=30)
        return body, [body]

    print_listing(
        fetch,
        title=f"model tokens of {who}",
        columns=USAGE_COLUMNS,
        fmt=fmt,
        watch=watch,
        interval=interval,
        updates=updates,
    )


_PER = {"hour": "an hour", "day": "a day", "month": "a month"}


def _tokens(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


USAGE_COLUMNS = (
    Column("tenant", lambda u: u["tenant_id"], is_id=True, wide_only=True),  # in the title
    Column(
        "budget",
        lambda u: (
            f"{u['budget']:,} {_PER[u['window']]}" if u["budget"] is not None else "not limited"
        ),
        no_wrap=True,
    ),
    Column("used", lambda u: _tokens(u["used"]), no_wrap=True),
    Column("reserved", lambda u: _tokens(u["reserved"]), no_wrap=True),
    Column("remaining", lambda u: _tokens(u["remaining"]), no_wrap=True),
    Column(
        "renews at",
        lambda u: "-" if u["resets_at_ms"] is None else local_time(u["resets_at_ms"]),
        no_wrap=True,
    ),
)


def register(app: typer.Typer) -> None:
    app.command("submit")(submit)
    app.command("drain")(drain)
    app.command("queue")(queue)
    app.command("models")(models)
    app.command("usage")(usage)
