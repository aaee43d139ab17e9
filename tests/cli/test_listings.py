"""``airt instances``, ``airt runs``, ``airt queue`` and ``airt drain`` as subprocesses
against a real served control plane (Valkey, a runtime host, the HTTP API on a TCP port):
in an 80-column terminal no id is wrapped or cut (the row's own id whole on one line, no
line wider than 80), ``-o wide`` shows every id whole with the extra columns, ``-o json``
and ``-o yaml`` parse to the same records, ``--watch`` redraws and stops after
``--updates``, and invalid combinations exit 2 naming the option."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from airuntime.fleet.registry import CapacityDescriptor, InstanceDescriptor, Registry
from airuntime.fleet.tenancy import IsolationMode, TenantSettings
from tests.polling import wait_until
from tests.runs.served import ServedControlPlane

LONG_INSTANCE = "tenant-a-runtime-1"


@pytest.fixture
def served(valkey_url: str, tmp_path: Path) -> Iterator[ServedControlPlane]:
    server = ServedControlPlane(valkey_url, f"sqlite:///{tmp_path / 'history.db'}")
    server.start()
    try:
        yield server
    finally:
        server.stop()


def airt(
    served: ServedControlPlane,
    *args: str,
    token: str = "alice-a",
    columns: int = 80,
    stdin: str | None = None,
    extra_env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": "/usr/bin:/bin",
        "AIRUNTIME_API_URL": served.url,
        "AIRUNTIME_API_TOKEN": f"token-{token}",
        "AIRUNTIME_REDIS_URL": served.redis_url,
        "COLUMNS": str(columns),
        "LINES": "50",
        **(extra_env or {}),
    }
    code = "import sys; from airuntime.cli.app import main; sys.argv[0] = 'airt'; main()"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        input=stdin if stdin is not None else "",
    )


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result.stdout


def whole_on_one_line(text: str, ids: list[str], width: int = 80) -> None:
    lines = text.splitlines()
    assert all(len(line) <= width for line in lines), "\n".join(lines)
    for i in ids:
        assert any(i in line for line in lines), f"{i} not whole on one line:\n{text}"


def submit(served: ServedControlPlane, token: str, n: int) -> list[str]:
    doc = {"id": "listed", "steps": [{"id": "a", "uses": "noop"}]}
    ids = []
    with httpx.Client(base_url=served.url, headers={"authorization": f"Bearer token-{token}"}) as c:
        for _ in range(n):
            r = c.post("/v1/runs", json={"pipeline": doc})
            assert r.status_code == 202, r.text
            ids.append(r.json()["shared_run_id"])
    return ids


def wait_succeeded(served: ServedControlPlane, ids: list[str], timeout_s: float = 60) -> None:
    headers = {"authorization": "Bearer token-alice-a"}
    with httpx.Client(base_url=served.url, headers=headers) as c:
        for srid in ids:
            wait_until(
                lambda: c.get(f"/v1/runs/{srid}").json()["status"] == "Succeeded",  # noqa: B023
                within=timeout_s,
                what=f"{srid} to succeed",
            )


def test_runs_table_wide_json_yaml(served: ServedControlPlane) -> None:
    ids = submit(served, "alice-a", 3)
    table = ok(airt(served, "runs"))
    whole_on_one_line(table, ids)
    as_json = json.loads(ok(airt(served, "runs", "-o", "json")))
    assert {r["shared_run_id"] for r in as_json["runs"]} == set(ids)
    as_yaml = yaml.safe_load(ok(airt(served, "runs", "-o", "yaml")))
    assert {r["shared_run_id"] for r in as_yaml["runs"]} == set(ids)
    wait_succeeded(served, ids)
    wide = ok(airt(served, "runs", "-o", "wide", "--status", "Succeeded"))
    assert "run id" in wide and "created" in wide
    detailed = json.loads(ok(airt(served, "runs", "--json", "--status", "Succeeded")))
    for run in detailed["runs"]:  # every id of the wide table whole, never shortened
        for value in (run["shared_run_id"], run["run_id"], run["assigned_instance_id"]):
            assert value and any(value in line for line in wide.splitlines()), value
    assert "…" not in wide


def test_instances_never_wrap_an_id(served: ServedControlPlane) -> None:
    async def register(redis: Any, _history: Any) -> None:
        registry = Registry(redis)
        descriptor = InstanceDescriptor(
            instance_id=LONG_INSTANCE,
            heartbeat_at_ms=0,
            endpoint="http://10.1.2.3:8080",
            tenant_id="tenant-a",
            isolation_mode=IsolationMode.DEDICATED,
            runtime_prefix="tenant-a-runtime",
            capacity=CapacityDescriptor(
                worker_count=4,
                active_worker_count=0,
                available_worker_count=4,
                max_local_workers_per_execution=4,
                queued_run_count=0,
                running_run_count=0,
                active_run_count=0,
                queue_capacity=10,
                max_concurrent_runs=2,
                available_run_slots=0,
                is_queue_paused=True,
                can_accept_run=False,
                snapshot_at_ms=0,
            ),
        )
        await registry.publish(descriptor, ttl_ms=600_000)

    served.call(register)
    table = ok(airt(served, "instances"))
    whole_on_one_line(table, [LONG_INSTANCE])
    listed = json.loads(ok(airt(served, "instances", "-o", "json")))
    ids = {d["instance_id"] for d in listed}
    assert LONG_INSTANCE in ids and len(ids) == 2
    whole_on_one_line(table, sorted(ids))
    as_yaml = yaml.safe_load(ok(airt(served, "instances", "-o", "yaml")))
    static = {d["instance_id"]: d["endpoint"] for d in listed}  # heartbeats move on
    assert {d["instance_id"]: d["endpoint"] for d in as_yaml} == static
    wide = ok(airt(served, "instances", "-o", "wide"))
    assert "http://10.1.2.3:8080" in wide and "endpoint" in wide
    visible = json.loads(ok(airt(served, "instances", "--tenant", "tenant-a", "-o", "json")))
    assert LONG_INSTANCE in {d["instance_id"] for d in visible}


def test_queue_listing_and_drain_with_totals(served: ServedControlPlane) -> None:
    async def starve_tenant_b(redis: Any, _history: Any) -> None:
        await Registry(redis).put_tenant(
            TenantSettings(
                tenant_id="tenant-b",
                isolation_mode=IsolationMode.DEDICATED,
                allow_shared_fallback=False,
                runtime_prefix="b-rt",
            )
        )

    served.call(starve_tenant_b)
    queued = submit(served, "bob-b", 3)

    # The background pump keeps trying them (and puts each back): one may be claimed
    # at the moment of a read.
    # It claims them in batches, so a read can also find all of them claimed: read again.
    def listed(fmt: str, parse: Any) -> Any:
        def read() -> Any:
            out = parse(ok(airt(served, "queue", "-o", fmt, token="bob-b")))
            return out if out["pending_by_tenant"] else None

        return wait_until(read, within=30, what=f"tenant-b's queue in -o {fmt}")

    body = listed("json", json.loads)
    assert set(body["pending_by_tenant"]) == {"tenant-b"}, body
    assert 1 <= body["pending"] == body["pending_by_tenant"]["tenant-b"] <= 3, body
    as_yaml = listed("yaml", yaml.safe_load)
    assert set(as_yaml["pending_by_tenant"]) == {"tenant-b"}

    def table_row() -> str | None:
        table = ok(airt(served, "queue", token="bob-b"))
        rows = [line for line in table.splitlines() if line.split("│")[1:2] == [" tenant-b "]]
        return table if rows else None

    wait_until(table_row, within=30, what="tenant-b's row in the queue table")
    # Another tenant sees only its own (empty) queue.
    assert json.loads(ok(airt(served, "queue", "-o", "json")))["pending_by_tenant"] == {}

    # The background pump claims whole batches: a manual drain can find every run held
    # by it for a moment ("empty"); drain again until it got one. None is dispatched.
    def drain_totals() -> dict[str, Any] | None:
        drained = airt(served, "drain", "--max-count", "6", "--batch", "2", token="bob-b")
        totals: dict[str, Any] = json.loads(ok(drained))
        assert totals["dispatched"] == 0, totals
        return totals if totals["failed"] >= 1 else None

    wait_until(drain_totals, within=30, what="a drain that tried tenant-b's runs")
    headers = {"authorization": "Bearer token-bob-b"}
    with httpx.Client(base_url=served.url, headers=headers) as c:
        statuses = {c.get(f"/v1/runs/{srid}").json()["status"] for srid in queued}
    assert statuses == {"QueuedGlobally"}, "a drain without capacity leaves every run queued"


def test_watch_redraws_until_updates_and_refuses_json(served: ServedControlPlane) -> None:
    ids = submit(served, "alice-a", 1)
    for args in (["runs"], ["instances"], ["queue"]):
        result = airt(served, *args, "--watch", "--interval", "0.1", "--updates", "3")
        text = ok(result)
        assert text.strip(), args
        if args == ["runs"]:
            whole_on_one_line(text, ids)
    refused = airt(served, "runs", "--watch", "-o", "json")
    assert refused.returncode == 2 and "--watch" in refused.stderr, refused.stderr
    contradiction = airt(served, "instances", "--json", "-o", "yaml")
    assert contradiction.returncode == 2 and "--json" in contradiction.stderr
    bad = airt(served, "queue", "-o", "xml")
    assert bad.returncode == 2 and "xml" in bad.stderr


def test_models_lists_the_providers_a_tenant_may_name(
    served: ServedControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    providers = {
        "openai": {"base_url": "https://api.openai.com/v1", "models": ["gpt-4o-mini", "o3"]},
        "local": {"base_url": "http://vllm.models.svc:8000/v1"},
    }
    monkeypatch.setenv("AIRUNTIME_MODEL_PROVIDERS", json.dumps(providers))

    async def narrow_tenant_b(redis: Any, _history: Any) -> None:
        await Registry(redis).put_tenant(
            TenantSettings(tenant_id="tenant-b", allowed_model_providers=("local",))
        )

    served.call(narrow_tenant_b)
    table = ok(airt(served, "models"))
    assert "gpt-4o-mini, o3" in table and "any" in table and "vllm" not in table
    assert [p["name"] for p in json.loads(ok(airt(served, "models", "-o", "json")))] == [
        "local",
        "openai",
    ]
    as_b = json.loads(ok(airt(served, "models", "-o", "json", token="bob-b")))
    assert [p["name"] for p in as_b] == ["local"]


def test_secrets_are_set_from_stdin_listed_by_name_and_deleted(served: ServedControlPlane) -> None:
    """``airt secrets``: the value comes from standard input (one trailing newline
    dropped), never from the command line, and no output ever shows it."""
    value = "cli-secret-value-0123456789"
    with_tenant = ("--tenant", "tenant-a")
    said = ok(airt(served, "secrets", "set", "API_TOKEN", *with_tenant, stdin=value + "\n"))
    assert "secret API_TOKEN of tenant-a set" in said and value not in said
    listed = json.loads(ok(airt(served, "secrets", "list", *with_tenant, "-o", "json")))
    assert [(s["name"], s["updated_by"]) for s in listed] == [("API_TOKEN", "alice-a")]
    table = ok(airt(served, "secrets", "list", *with_tenant))
    assert "API_TOKEN" in table and value not in table

    async def stored(redis: Any, _history: Any) -> Any:
        return json.loads(await redis.hget("air:{air}:tenant:tenant-a:secrets", "API_TOKEN"))

    assert served.call(stored)["value"] == value, "exactly what was piped in, newline dropped"
    short = airt(served, "secrets", "set", "API_TOKEN", *with_tenant, stdin="abc")
    assert short.returncode == 2 and "value: is 3 characters" in short.stderr + short.stdout
    other = airt(served, "secrets", "list", "--tenant", "tenant-a", token="bob-b")
    assert other.returncode == 2 and "404" in other.stderr + other.stdout
    no_tenant = airt(served, "secrets", "list")
    assert no_tenant.returncode == 2 and "--tenant" in no_tenant.stderr + no_tenant.stdout
    assert "deleted" in ok(airt(served, "secrets", "delete", "API_TOKEN", *with_tenant))
    again = airt(served, "secrets", "delete", "API_TOKEN", *with_tenant)
    assert again.returncode == 2 and "not found" in again.stderr + again.stdout


def test_usage_shows_the_tenants_model_token_budget(served: ServedControlPlane) -> None:
    """``airt usage``: the budget, what is used, held and left, and when it renews; "not
    limited" for a tenant without one; another tenant's is not found."""

    async def budget_and_use(redis: Any, _history: Any) -> None:
        from airuntime.engine.model_budget import BudgetWindow, ModelBudgets, ModelTokenBudget

        await Registry(redis).put_tenant(
            TenantSettings(
                tenant_id="tenant-a",
                model_token_budget=ModelTokenBudget(tokens=120_000, window=BudgetWindow.HOUR),
            )
        )
        budgets = ModelBudgets(redis)
        held = await budgets.reserve("tenant-a", 5_000)
        assert held is not None
        await budgets.settle(held, 1_234)
        assert await budgets.reserve("tenant-a", 700) is not None  # a call going on

    served.call(budget_and_use)
    with_tenant = ("--tenant", "tenant-a")
    row = json.loads(ok(airt(served, "usage", *with_tenant, "-o", "json")))
    assert (row["budget"], row["window"], row["used"], row["reserved"], row["remaining"]) == (
        120_000, "hour", 1_234, 700, 120_000 - 1_234 - 700
    )  # fmt: skip
    assert row["resets_at_ms"] - row["window_started_at_ms"] == 3_600_000
    table = ok(airt(served, "usage", *with_tenant))
    for shown in ("model tokens of tenant-a", "120,000 an hour", "1,234", "700", "118,066"):
        assert shown in table, table
    assert "…" not in table and all(len(line) <= 80 for line in table.splitlines()), table
    mine = json.loads(ok(airt(served, "usage", "--tenant", "tenant-b", "-o", "json",
                              token="bob-b")))  # fmt: skip
    assert mine["budget"] is None
    assert "not limited" in ok(airt(served, "usage", "--tenant", "tenant-b", token="bob-b"))
    other = airt(served, "usage", "--tenant", "tenant-a", token="bob-b")
    assert other.returncode == 2 and "404" in other.stderr + other.stdout


def test_secrets_reseal_seals_every_stored_value_under_the_first_key(
    served: ServedControlPlane,
) -> None:
    """``airt secrets reseal`` (platform operators, on the shared Redis): a value stored as
    written is sealed under the first key and still reads the same; without keys, or with
    a malformed one, it refuses naming the variable and changes nothing."""
    from airuntime.engine.secret_sealing import Sealer
    from airuntime.engine.tenant_secrets import TenantSecrets

    key = "cli-rotation-key-" + "r" * 40
    value = "stored-as-written-0123456789"

    async def put_plain(redis: Any, _history: Any) -> None:
        await TenantSecrets(redis, sealer=None).put("tenant-a", "LEGACY", value, "alice-a")

    async def stored(redis: Any, _history: Any) -> tuple[bytes, dict[str, str]]:
        raw = await redis.hget("air:{air}:tenant:tenant-a:secrets", "LEGACY")
        opened = await TenantSecrets(redis, sealer=Sealer((key,))).values("tenant-a", {"LEGACY"})
        return raw, opened

    served.call(put_plain)
    unset = airt(served, "secrets", "reseal")
    assert unset.returncode == 2 and "AIRUNTIME_SECRETS_KEYS: not set" in unset.stderr
    short = airt(served, "secrets", "reseal", extra_env={"AIRUNTIME_SECRETS_KEYS": "short"})
    assert short.returncode == 2 and "key 1 has 5 characters" in short.stderr
    assert served.call(stored)[0] is not None and value.encode() in served.call(stored)[0]
    said = ok(airt(served, "secrets", "reseal", extra_env={"AIRUNTIME_SECRETS_KEYS": key}))
    assert f"sealed under key {Sealer((key,)).fingerprint}: 1 resealed, 0 already" in said
    raw, opened = served.call(stored)
    assert value.encode() not in raw and opened == {"LEGACY": value}
    listed = json.loads(ok(airt(served, "secrets", "list", "--tenant", "tenant-a", "-o", "json")))
    assert [s["sealed_with"] for s in listed if s["name"] == "LEGACY"] == [
        Sealer((key,)).fingerprint
    ]
