"""``airt runs [show|events|trace|report|answer|pause|resume|cancel|replay]``: read and steer runs.

Why this exists: the control plane's run reads (:mod:`airuntime.control_plane.api.run_reads`)
and steering (:mod:`~airuntime.control_plane.api.run_steer`) from a terminal, for runs
still in Redis and runs in the durable archive alike. Tables by default, ``--json`` for
machines. ``replay --compare`` waits for the replay and diffs its terminal snapshot
against the original's (step statuses, outputs, attempts; timings, workers and ids
ignored): exit 0 when identical, 1 with the diff when not, 2 for invalid input.
"""

from __future__ import annotations

import json
import time
from typing import Annotated, Any

import httpx
import typer

from airuntime.cli.client import (
    UNAVAILABLE,
    _Api,
    _client,
    _Token,
    api_call,
    create_request,
    detail_text,
    error_detail,
    new_idempotency_key,
    shared_run_id,
)
from airuntime.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    console,
    invalid,
    out,
    parse_kv,
    print_table,
)
from airuntime.cli.listing import (
    Column,
    Interval,
    Output,
    OutputFormat,
    Updates,
    Watch,
    local_time,
    middle,
    output_format,
    print_listing,
    step_table,
    table,
)

runs_app = typer.Typer(
    help="List, read and steer shared runs (hot or archived).",
    invoke_without_command=True,
)

_Tenant = Annotated[str | None, typer.Option(help="Act as this tenant (local stack tokens).")]
_Json = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]
_WaitTimeout = Annotated[
    float, typer.Option("--timeout", min=1, help="Seconds to wait for the run to end.")
]
_Id = Annotated[str, typer.Argument(help="The SharedRunId (sr-...).", callback=shared_run_id)]
ENDED = frozenset({"Succeeded", "Failed", "Cancelled", "Rejected"})


def _get(base: str, token: str, srid: str, path: str = "", **params: Any) -> Any:
    return api_call("GET", f"{base}/v1/runs/{srid}{path}", token, timeout=30, params=params)


def _dump(value: Any) -> None:
    out.print_json(json.dumps(value))


_Limit = Annotated[int, typer.Option(min=1, max=1000)]
_Status = Annotated[list[str] | None, typer.Option(help="Only these statuses.")]
_Pipeline = Annotated[str | None, typer.Option(help="Only this pipeline id.")]
_Cursor = Annotated[str | None, typer.Option(help="The next_cursor of a previous page.")]
_ListJson = Annotated[bool, typer.Option("--json", help="Same as -o json.")]


@runs_app.callback()
def list_runs(
    ctx: typer.Context,
    tenant: _Tenant = None,
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 50,
    status: Annotated[list[str] | None, typer.Option(help="Only these statuses.")] = None,
    pipeline: Annotated[str | None, typer.Option(help="Only this pipeline id.")] = None,
    cursor: Annotated[str | None, typer.Option(help="The next_cursor of a previous page.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Same as -o json.")] = False,
    output: Output = None,
    watch: Watch = False,
    interval: Interval = 2.0,
    updates: Updates = None,
    api: _Api = None,
    token: _Token = None,
) -> None:
    """List the caller tenant's runs, hot and archived, newest first (`airt runs` or
    `airt runs list`)."""
    ctx.obj = {"tenant": tenant, "api": api, "token": token}
    if ctx.invoked_subcommand is not None:
        return
    fmt = output_format(output, as_json)
    base, tok = _client(api, token, tenant)
    params: dict[str, Any] = {"limit": limit, "status": status or []}
    params.update({k: v for k, v in (("pipeline", pipeline), ("cursor", cursor)) if v})
    last: dict[str, Any] = {}

    def fetch() -> tuple[Any, list[Any]]:
        page = api_call("GET", f"{base}/v1/runs", tok, params=params, timeout=30)
        last.update(page)
        return page, page["runs"]

    print_listing(
        fetch,
        title="shared runs",
        columns=RUN_COLUMNS,
        fmt=fmt,
        watch=watch,
        interval=interval,
        updates=updates,
    )
    if last.get("next_cursor") and fmt in (OutputFormat.TABLE, OutputFormat.WIDE):
        console.print(f"more: --cursor {last['next_cursor']}")


# The listing is also a command of its own, as users type it first (`gh run list`):
# the same function, run with no subcommand under it, so it lists.
runs_app.command("list")(list_runs)


RUN_COLUMNS = (
    Column("shared run", lambda r: r["shared_run_id"], is_id=True),
    Column("status", lambda r: r["status"], no_wrap=True),
    Column("pipeline", lambda r: r["pipeline_id"]),
    Column("instance", lambda r: r.get("assigned_instance_id") or "-", is_id=True, wide_only=True),
    Column("run id", lambda r: r.get("run_id") or "-", is_id=True, wide_only=True),
    Column("replay of", lambda r: r.get("replay_of") or "-", is_id=True, wide_only=True),
    Column("created", lambda r: local_time(r.get("created_at_ms")), no_wrap=True, wide_only=True),
)
"""``airt runs``: the row's shared run id whole, never wrapped (80 columns fit it, the
status and the pipeline); ``wide`` adds where it ran, the runtime's run id, the replayed
run and the creation time."""


def _conn(ctx: typer.Context, tenant: str | None) -> tuple[str, str]:
    parent: dict[str, Any] = ctx.obj or {}
    return _client(parent.get("api"), parent.get("token"), tenant or parent.get("tenant"))


@runs_app.command("show")
def show(ctx: typer.Context, srid: _Id, tenant: _Tenant = None, as_json: _Json = False) -> None:
    """A run's identities, status, and every step's record."""
    base, tok = _conn(ctx, tenant)
    body = _get(base, tok, srid)
    if as_json:
        _dump(body)
        return
    ex = body.get("execution") or {}
    console.print(
        f"{body['shared_run_id']} {body['pipeline_id']} [{body['status']}] "
        f"run {body.get('run_id') or '-'} on {body.get('assigned_instance_id') or '-'}; "
        f"execution {ex.get('execution_id', '-')} {ex.get('status', '')}"
        + (f"; replay of {body['replay_of']}" if body.get("replay_of") else "")
    )
    steps = list((body.get("steps") or {}).items())
    title = f"{body['pipeline_id']} [{ex.get('status', body['status'])}]"
    print_table(step_table(title, steps))


def _print_event(event: dict[str, Any], as_json: bool) -> None:
    if as_json:
        out.print(json.dumps(event), highlight=False)
        return
    fields = " ".join(f"{k}={v}" for k, v in event["fields"].items())
    out.print(f"{event['seq']:>5} {event['id']} {event['type']} {fields}", highlight=False)


@runs_app.command("events")
def events(
    ctx: typer.Context,
    srid: _Id,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Until the run ends.")] = False,
    limit: Annotated[int, typer.Option(min=1, max=999)] = 500,
    tenant: _Tenant = None,
    as_json: _Json = False,
) -> None:
    """The run's ledger (one line per entry); --follow streams it until the run ended."""
    base, tok = _conn(ctx, tenant)
    if follow:
        _follow_events(base, tok, srid, as_json)
        return
    cursor: str | None = None
    while True:
        params: dict[str, Any] = {"limit": limit, **({"cursor": cursor} if cursor else {})}
        page = _get(base, tok, srid, "/events", **params)
        for event in page["events"]:
            _print_event(event, as_json)
        cursor = page["next_cursor"]
        if cursor is None:
            return


RECONNECT_FOR_S: float = 60.0
"""How long ``--follow`` keeps trying to reach a control plane that went away (a
restart, a rolling update) before it gives up, exit 2."""


def _follow_events(base: str, token: str, srid: str, as_json: bool) -> None:
    """Print the run's ledger as it is written until the run ended. A stream that ends
    without ``end`` (the control plane stopped) or breaks is followed again from the
    last entry's ``id`` (a cursor), so no entry is shown twice or missed, for up to
    :data:`RECONNECT_FOR_S` seconds without a connection."""
    url = f"{base}/v1/runs/{srid}/events"
    headers = {"authorization": f"Bearer {token}", "accept": "text/event-stream"}
    cursor: str | None = None
    lost_at: float | None = None
    while True:
        try:
            params = {"follow": "true", **({"cursor": cursor} if cursor else {})}
            with httpx.stream("GET", url, headers=headers, params=params, timeout=None) as resp:
                if resp.status_code >= 400 and resp.status_code not in UNAVAILABLE:
                    resp.read()
                    raise invalid(f"{resp.status_code}: {detail_text(error_detail(resp))}")
                if resp.status_code < 400:
                    lost_at = None
                    ended, cursor = _print_stream(resp, cursor, as_json)
                    if ended:
                        return
        except httpx.HTTPError as exc:
            if not isinstance(exc, httpx.TransportError):
                raise invalid(f"cannot follow {url}: {exc}") from None
        now = time.monotonic()
        if lost_at is None:
            lost_at = now
            console.print("the stream ended before the run did; following again", highlight=False)
        elif now - lost_at > RECONNECT_FOR_S:
            raise invalid(
                f"cannot follow {url}: the control plane did not answer for {RECONNECT_FOR_S:g} s"
            )
        time.sleep(0.5)


def _print_stream(
    resp: httpx.Response, cursor: str | None, as_json: bool
) -> tuple[bool, str | None]:
    """Print a stream's entries; whether it ended with ``end``, and the last entry's
    cursor (where to follow again from)."""
    event = ""
    for line in resp.iter_lines():
        if line.startswith("id: "):
            cursor = line.removeprefix("id: ")
        elif line.startswith("event: "):
            event = line.removeprefix("event: ")
        elif line.startswith("data: "):
            data = json.loads(line.removeprefix("data: "))
            if event == "end":
                console.print(f"run ended: {data['status']}")
                return True, cursor
            _print_event(data, as_json)
    return False, cursor


@runs_app.command("trace")
def trace(ctx: typer.Context, srid: _Id, tenant: _Tenant = None, as_json: _Json = False) -> None:
    """Per-step timeline: claims, retries, recoveries, ends, worker and instance."""
    base, tok = _conn(ctx, tenant)
    body = _get(base, tok, srid, "/trace")
    if as_json:
        _dump(body)
        return
    t0 = body["created_at_ms"]

    def at(ms: int | None) -> str:
        return f"+{ms - t0}ms" if ms else "-"

    columns = (
        Column("step", lambda r: r["step"], is_id=True),
        Column("status", lambda r: r["status"] or "-", no_wrap=True),
        Column("start", lambda r: at(r.get("start_ms")), no_wrap=True),
        Column("end", lambda r: at(r.get("end_ms")), no_wrap=True),
        Column("attempts", _outcomes),
        Column("instance", _instances, is_id=True),
    )
    title = f"trace {body['execution_id']} [{body['status']}]"
    print_table(table(title, columns, body["steps"], wide=False))


def _outcomes(row: dict[str, Any]) -> str:
    return ", ".join(f"{a['attempt']}:{a['outcome'] or 'running'}" for a in row["attempts"]) or "-"


def _instances(row: dict[str, Any]) -> str:
    """The instances a step's attempts ran on, one a line, long ones middle-shortened."""
    instances = sorted({a["instance_id"] or "-" for a in row["attempts"]})
    return "\n".join(middle(i) for i in instances) or "-"


@runs_app.command("report")
def report(ctx: typer.Context, srid: _Id, tenant: _Tenant = None, as_json: _Json = False) -> None:
    """Durations, critical path, retries, recoveries, slot waits and evidence."""
    base, tok = _conn(ctx, tenant)
    body = _get(base, tok, srid, "/report")
    if as_json:
        _dump(body)
        return
    columns = (
        Column("step", lambda r: r["step"], is_id=True),
        Column("status", lambda r: r["status"] or "-", no_wrap=True),
        Column("duration", lambda r: f"{r['duration_ms']}ms", no_wrap=True),
        Column("attempts", lambda r: str(r["attempts"]), no_wrap=True),
        Column("retries", lambda r: str(r["retries"]), no_wrap=True),
        Column("recoveries", lambda r: str(r["recoveries"]), no_wrap=True),
    )
    title = f"report {body['execution_id']} [{body['status']}]"
    print_table(table(title, columns, body["steps"], wide=False))
    path = body["critical_path"]
    out.print(
        f"wall {body['wall_ms']}ms; critical path {' -> '.join(path['steps'])} "
        f"({path['duration_ms']}ms); retries {body['retries']}, recoveries "
        f"{body['recoveries']}; slot wait {body['slot_wait_ns'] / 1e6:.3f}ms",
        highlight=False,
    )
    for usage in body.get("model_usage") or ():
        out.print(
            f"model {usage['provider']}/{usage['model']}: {usage['calls']} calls, "
            f"{usage['input_tokens']:,} input and {usage['output_tokens']:,} output tokens",
            highlight=False,
        )


@runs_app.command("answer")
def answer(
    ctx: typer.Context,
    srid: _Id,
    step: Annotated[str, typer.Argument(help="The input step.")],
    value: Annotated[str, typer.Argument(help="JSON, or plain text.")],
    tenant: _Tenant = None,
) -> None:
    """Answer an input step of a running execution."""
    base, tok = _conn(ctx, tenant)
    decoded = parse_kv([f"value={value}"], "VALUE")["value"]
    body = {"step": step, "value": decoded}
    _dump(api_call("POST", f"{base}/v1/runs/{srid}/input", tok, json=body, timeout=30))


@runs_app.command("pause")
def pause(ctx: typer.Context, srid: _Id, tenant: _Tenant = None) -> None:
    """Pause the run's execution (running steps finish, no new ones start)."""
    base, tok = _conn(ctx, tenant)
    _dump(api_call("POST", f"{base}/v1/runs/{srid}/pause", tok, timeout=30))


@runs_app.command("resume")
def resume(ctx: typer.Context, srid: _Id, tenant: _Tenant = None) -> None:
    """Resume a paused execution."""
    base, tok = _conn(ctx, tenant)
    _dump(api_call("POST", f"{base}/v1/runs/{srid}/resume", tok, timeout=30))


@runs_app.command("cancel")
def cancel(
    ctx: typer.Context,
    srid: _Id,
    wait: Annotated[
        bool, typer.Option("--wait", help="Wait until the run ended; exit 1 unless Cancelled.")
    ] = False,
    timeout_s: _WaitTimeout = 600,
    tenant: _Tenant = None,
) -> None:
    """Cancel the run: at once while it is queued; once dispatched, its running steps are
    stopped and it ends Cancelled when its execution did."""
    base, tok = _conn(ctx, tenant)
    answer = api_call("POST", f"{base}/v1/runs/{srid}/cancel", tok, timeout=30)
    if not wait:
        _dump(answer)
        return
    status = wait_ended(base, tok, srid, timeout_s)["status"]
    console.print(f"run {srid} ended: {status}", highlight=False)
    raise typer.Exit(EXIT_OK if status == "Cancelled" else EXIT_FAILED)


def wait_ended(base: str, token: str, srid: str, timeout_s: float) -> dict[str, Any]:
    """The run's details once its shared run ended (polls, with a deadline)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        body: dict[str, Any] = _get(base, token, srid)
        if body["status"] in ENDED:
            return body
        time.sleep(0.2)
    raise invalid(f"run {srid} did not end within {timeout_s} s")


def snapshot_diff(original: dict[str, Any], replay: dict[str, Any]) -> list[str]:
    """What differs between two runs' terminal records: the execution status and each
    step's status, output and attempts (timings, workers and ids are not compared)."""
    lines: list[str] = []
    a, b = original.get("execution") or {}, replay.get("execution") or {}
    if a.get("status") != b.get("status"):
        lines.append(f"status: {a.get('status')} != {b.get('status')}")
    sa, sb = original.get("steps") or {}, replay.get("steps") or {}
    for step in sorted(set(sa) | set(sb)):
        left, right = sa.get(step), sb.get(step)
        if left is None or right is None:
            lines.append(f"step {step}: only in the {'replay' if left is None else 'original'}")
            continue
        for name in ("status", "output", "attempts"):
            if left.get(name) != right.get(name):
                lines.append(
                    f"step {step} {name}: {json.dumps(left.get(name))} != "
                    f"{json.dumps(right.get(name))}"
                )
    return lines


@runs_app.command("replay")
def replay(
    ctx: typer.Context,
    srid: _Id,
    compare: Annotated[
        bool, typer.Option("--compare", help="Wait and diff against the original.")
    ] = False,
    timeout_s: _WaitTimeout = 600,
    tenant: _Tenant = None,
    as_json: _Json = False,
) -> None:
    """Submit the run again (same pipeline, inputs, context) as a new linked run."""
    base, tok = _conn(ctx, tenant)
    new = create_request(f"{base}/v1/runs/{srid}/replay", tok, new_idempotency_key())
    console.print(f"replay {new['shared_run_id']} of {srid}: {new['status']}")
    if not compare:
        _dump(new)
        return
    original = wait_ended(base, tok, srid, timeout_s)
    replayed = wait_ended(base, tok, new["shared_run_id"], timeout_s)
    diff = snapshot_diff(original, replayed)
    if as_json:
        _dump({"original": srid, "replay": new["shared_run_id"], "diff": diff})
    elif diff:
        text = "\n".join(["replay differs from the original:", *diff])
        out.print(text, highlight=False)
    else:
        text = f"replay {new['shared_run_id']} is identical to {srid}"
        out.print(text, highlight=False)
    raise typer.Exit(EXIT_FAILED if diff else EXIT_OK)


def register(app: typer.Typer) -> None:
    app.add_typer(runs_app, name="runs")
