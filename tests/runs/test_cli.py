"""``airt runs ...`` and ``airt submit --wait`` as subprocesses against a real control
plane (its API on a TCP port, a runtime host, the durable history on SQLite and on
PostgreSQL): tables and ``--json``, the ledger followed to the end, answer, pause and
resume, and ``replay --compare`` -- identical for every packaged example (exit 0),
different for a nondeterministic python handler (exit 1, with the diff)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from airuntime.examples import all_examples
from tests.engine.model_server import model_server, openai_text
from tests.polling import wait_until
from tests.runs.archive import archive_and_expire
from tests.runs.served import ServedControlPlane

NONDETERMINISTIC = "tests.runs.nondeterministic"


@pytest.fixture
def served(
    valkey_url: str, history_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[ServedControlPlane]:
    monkeypatch.setenv("AIRUNTIME_PYTHON_HANDLER_MODULES", NONDETERMINISTIC)
    server = ServedControlPlane(valkey_url, history_dsn)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def airt(
    served: ServedControlPlane, *args: str, token: str = "alice-a", columns: int = 200
) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": "/usr/bin:/bin",
        "AIRUNTIME_API_URL": served.url,
        "AIRUNTIME_API_TOKEN": f"token-{token}",
        "COLUMNS": str(columns),
        "AIRUNTIME_PYTHON_HANDLER_MODULES": NONDETERMINISTIC,  # the client checks the file too
    }
    code = "import sys; from airuntime.cli.app import main; sys.argv[0] = 'airt'; main()"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result.stdout


def submitted(
    served: ServedControlPlane, pipeline: str, *extra: str
) -> tuple[str, subprocess.CompletedProcess[str]]:
    result = airt(served, "submit", pipeline, "--wait", *extra)
    assert "submitted " in result.stderr, result.stdout + result.stderr
    srid = result.stderr.split("submitted ", 1)[1].split(":", 1)[0]
    return srid, result


def test_submit_wait_show_events_trace_report_on_hot_and_archived_runs(
    served: ServedControlPlane,
) -> None:
    srid, result = submitted(served, "retries", "--json")
    snapshot = json.loads(ok(result))
    assert snapshot["status"] == "Succeeded"
    assert snapshot["steps"]["report"]["output"] == "succeeded on the third attempt"

    def views() -> dict[str, Any]:
        return {
            "show": json.loads(ok(airt(served, "runs", "show", srid, "--json"))),
            "events": ok(airt(served, "runs", "events", srid, "--json", "--limit", "2")),
            "trace": json.loads(ok(airt(served, "runs", "trace", srid, "--json"))),
            "report": json.loads(ok(airt(served, "runs", "report", srid, "--json"))),
        }

    before = views()
    assert before["show"]["steps"]["flaky"]["attempts"] == 3
    assert before["report"]["retries"] == 2
    lines = [json.loads(line) for line in before["events"].splitlines()]
    assert [e["seq"] for e in lines] == list(range(len(lines))) and len(lines) > 2
    table = ok(airt(served, "runs", "show", srid))
    assert "flaky" in table and "succeeded on the third attempt" in table
    # The path is the longest chain by durations: flaky (retried twice) always, then
    # "report" too unless it took 0 ms; the table prints what the JSON report says.
    path = before["report"]["critical_path"]["steps"]
    assert path[0] == "flaky" and set(path) <= {"flaky", "report"}, path
    assert f"critical path {' -> '.join(path)}" in ok(airt(served, "runs", "report", srid))
    assert "1:retried, 2:retried, 3:completed" in ok(airt(served, "runs", "trace", srid))
    assert srid in ok(airt(served, "runs"))

    served.call(lambda redis, store: archive_and_expire(redis, store, srid))
    assert views() == before
    assert srid in ok(airt(served, "runs", "--json"))
    listed = json.loads(ok(airt(served, "runs", "list", "--json", "--limit", "5")))
    assert listed == json.loads(ok(airt(served, "runs", "--json", "--limit", "5")))
    assert srid in [r["shared_run_id"] for r in listed["runs"]]
    refused = airt(served, "runs", "show", srid, token="bob-b")
    assert refused.returncode == 2 and "404" in refused.stderr


def test_failing_submit_wait_exits_1_and_bad_input_exits_2(
    served: ServedControlPlane, tmp_path: Path
) -> None:
    failing = {"id": "fails", "steps": [{"id": "x", "uses": "fail", "with": {"fail_attempts": 9}}]}
    path = tmp_path / "fails.yaml"
    path.write_text(json.dumps(failing))
    srid, result = submitted(served, str(path))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Failed" in result.stdout
    assert airt(served, "runs", "show", "sr-nope").returncode == 2
    bad = airt(served, "runs", "events", srid, "--limit", "0")
    assert bad.returncode == 2


def test_a_malformed_run_id_is_refused_naming_it_before_it_reaches_a_url(
    served: ServedControlPlane,
) -> None:
    # `sr-../../x` put in a URL path would address /v1/runs/x (the client resolves the
    # dot segments): the server would refuse `x`, a value the user never typed.
    for command in ("show", "events", "trace", "report", "pause", "resume", "replay"):
        refused = airt(served, "runs", command, "sr-../../x")
        assert refused.returncode == 2, (command, refused.stderr)
        assert "'sr-../../x' is not a shared run id" in refused.stderr, (command, refused.stderr)


def test_a_refusal_by_the_api_reads_as_where_what_and_value(
    served: ServedControlPlane, tmp_path: Path
) -> None:
    path = tmp_path / "escape.yaml"
    path.write_text(json.dumps({"id": "escape", "steps": [{"id": "x", "uses": "os.system"}]}))
    refused = airt(served, "submit", str(path))
    assert refused.returncode == 2, refused.stdout + refused.stderr
    # One line: the field's path in the request body, the server's reason; not the
    # repr of FastAPI's error list.
    line = " ".join(refused.stderr.split())
    assert line.startswith(
        "error: 422: pipeline.steps.0.uses: step 'x': unknown handler 'os.system'"
    ), line
    assert "[{" not in line and "'loc'" not in line, line


def test_show_lists_steps_in_plan_order_hot_and_archived(served: ServedControlPlane) -> None:
    srid, result = submitted(served, "summarize-documents")
    ok(result)
    plan_order = [
        row["step"]
        for row in json.loads(ok(airt(served, "runs", "trace", srid, "--json")))["steps"]
    ]
    assert plan_order != sorted(plan_order), plan_order  # else the order proves nothing

    def shown() -> tuple[list[str], list[str]]:
        steps = list(json.loads(ok(airt(served, "runs", "show", srid, "--json")))["steps"])
        table = ok(airt(served, "runs", "show", srid))
        rows = [line.split("│")[1].strip() for line in table.splitlines() if line.startswith("│ ")]
        return steps, [r for r in rows if r]

    assert shown() == (plan_order, plan_order)
    served.call(lambda redis, store: archive_and_expire(redis, store, srid))
    assert shown() == (plan_order, plan_order)


MARKUP = "[/oops] [bold]not bold[/bold] [link=file:///etc/passwd]x"
"""What a tenant may write in a step's output: rich markup, one tag unbalanced."""
LONG_STEP = "summarize_feedback_batch_03"
"""A step id as long as real ones get: rich folded it over two lines at 80 columns."""


def test_what_tenants_wrote_prints_literally_and_lines_stay_whole_in_80_columns(
    served: ServedControlPlane, tmp_path: Path
) -> None:
    """Each of these printed a traceback (rich read the output as markup: ``MarkupError``)
    or, piped at 80 columns, broke an id, a ledger line or a JSON string over lines."""
    spaced = "words " * 30
    pipeline = tmp_path / "markup.yaml"
    pipeline.write_text(
        "id: markup\n"
        "steps:\n"
        f"  - id: {LONG_STEP}\n"
        "    uses: echo\n"
        "    with:\n"
        f"      value: {json.dumps(MARKUP)}\n"
        "  - id: spaced\n"
        "    uses: echo\n"
        "    with:\n"
        f"      value: {json.dumps(spaced)}\n"
    )
    waited = airt(served, "submit", str(pipeline), "--wait", columns=80)
    assert waited.returncode == 0, waited.stdout + waited.stderr
    assert "Traceback" not in waited.stderr, waited.stderr
    assert "[/oops]" in waited.stdout and "bold[/bold]" in waited.stdout, waited.stdout
    srid = waited.stderr.split("submitted ", 1)[1].split(":", 1)[0]

    shown = airt(served, "runs", "show", srid, columns=80)
    assert shown.returncode == 0 and "Traceback" not in shown.stderr, shown.stderr
    header = next(line for line in shown.stderr.splitlines() if line.startswith(srid))
    record = json.loads(ok(airt(served, "runs", "show", srid, "--json")))
    assert record["run_id"] in header and record["execution"]["execution_id"] in header, header
    rows = [line for line in shown.stdout.splitlines() if line.startswith("│ ")]
    assert any(LONG_STEP in row for row in rows), shown.stdout  # the step id whole on one line
    assert "[/oops]" in shown.stdout and "bold[/bold]" in shown.stdout, shown.stdout
    assert all(len(line) <= 80 for line in shown.stdout.splitlines() if "│" in line)

    for command in ("trace", "report"):
        table = ok(airt(served, "runs", command, srid, columns=80))
        assert any(LONG_STEP in line for line in table.splitlines()), (command, table)

    entries = ok(airt(served, "runs", "events", srid, "--json", columns=80)).splitlines()
    seqs = [json.loads(entry)["seq"] for entry in entries]  # one whole JSON a line
    lines = ok(airt(served, "runs", "events", srid, columns=80)).splitlines()
    assert [int(line.split()[0]) for line in lines] == seqs, lines  # one line an entry

    second = airt(served, "submit", str(pipeline), columns=80)  # its answer: > 80 characters
    assert second.returncode == 0, second.stderr
    assert len(second.stdout.splitlines()) == 1, second.stdout
    assert json.loads(second.stdout)["shared_run_id"].startswith("sr-"), second.stdout


def test_submit_again_with_the_same_idempotency_key_is_the_same_run(
    served: ServedControlPlane,
) -> None:
    first = airt(served, "submit", "summarize-documents", "--idempotency-key", "nightly-2026-12-07")
    again = airt(served, "submit", "summarize-documents", "--idempotency-key", "nightly-2026-12-07")
    srid = json.loads(ok(first))["shared_run_id"]
    assert json.loads(ok(again))["shared_run_id"] == srid
    assert "(the run this idempotency key created)" in again.stderr, again.stderr
    assert "idempotency key created" not in first.stderr
    bad = airt(served, "submit", "summarize-documents", "--idempotency-key", "two words")
    assert bad.returncode == 2 and "--idempotency-key: 'two words'" in bad.stderr, bad.stderr


def test_answer_pause_resume_and_follow_through_the_cli(served: ServedControlPlane) -> None:
    result = airt(served, "submit", "human-input")
    srid = json.loads(ok(result))["shared_run_id"]
    follower = subprocess.Popen(  # follows the ledger while the run waits, is paused, ends
        [sys.executable, "-c", "import sys; from airuntime.cli.app import main; main()",
         "runs", "events", srid, "--follow", "--json"],
        env={"PATH": "/usr/bin:/bin", "AIRUNTIME_API_URL": served.url,
             "AIRUNTIME_API_TOKEN": "token-alice-a"},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        with _http(served) as http:
            wait_until(lambda: _waiting_for_input(http, srid), what="approve waits for its answer")
        refused = airt(served, "runs", "answer", srid, "draft", '"x"')
        assert refused.returncode == 2 and "step 'draft' is completed" in refused.stderr
        assert json.loads(ok(airt(served, "runs", "pause", srid)))["status"] in (
            "Pausing",
            "Paused",
        )
        ok(airt(served, "runs", "answer", srid, "approve", '{"approved": true}'))
        assert json.loads(ok(airt(served, "runs", "resume", srid)))["execution_id"]
        stdout, stderr = follower.communicate(timeout=120)
    finally:
        follower.kill()
    assert follower.returncode == 0, stderr
    types = [json.loads(line)["type"] for line in stdout.splitlines()]
    assert types[0] == "execution_created" and "execution_finalized" in types
    assert types.index("execution_paused") < types.index("input_provided")
    assert "run ended: Succeeded" in stderr


def test_cancel_through_the_cli_ends_the_run_cancelled_and_only_for_its_tenant(
    served: ServedControlPlane,
) -> None:
    srid = json.loads(ok(airt(served, "submit", "human-input")))["shared_run_id"]
    with _http(served) as http:
        wait_until(lambda: _waiting_for_input(http, srid), what="approve waits for its answer")
    other = airt(served, "runs", "cancel", srid, token="bob-b")
    assert other.returncode == 2 and "404" in other.stderr, other.stderr
    not_allowed = airt(served, "runs", "cancel", srid, token="sub-a")
    assert not_allowed.returncode == 2 and "403" in not_allowed.stderr, not_allowed.stderr
    assert "waiting" in ok(airt(served, "runs", "show", srid)).lower()  # neither touched it
    cancelled = airt(served, "runs", "cancel", srid, "--wait")
    assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
    assert f"run {srid} ended: Cancelled" in " ".join(cancelled.stderr.split())
    shown = json.loads(ok(airt(served, "runs", "show", srid, "--json")))
    assert shown["status"] == "Cancelled" and shown["execution"]["status"] == "Cancelled"
    again = airt(served, "runs", "cancel", srid)  # an ended run: the answer is its status
    assert json.loads(ok(again))["status"] == "Cancelled"


@pytest.mark.parametrize("example", sorted(e.name for e in all_examples()))
def test_replay_compare_is_identical_for_every_packaged_example(
    served: ServedControlPlane, example: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if example == "human-input":
        _replay_an_answered_run(served)
        return
    with contextlib.ExitStack() as stack:
        if example == "model-review":  # its provider, `local`, answering both runs alike
            server = stack.enter_context(model_server())
            providers = {"local": {"base_url": server.openai_url}}
            monkeypatch.setenv("AIRUNTIME_MODEL_PROVIDERS", json.dumps(providers))
            review = openai_text('{"approved": true, "reason": "clear"}')
            server.answers.extend([(200, openai_text("A draft.")), (200, review)] * 2)
        _replay_and_compare(served, example)


def _replay_and_compare(served: ServedControlPlane, example: str) -> None:
    srid, result = submitted(served, example)
    ok(result)
    compared = airt(served, "runs", "replay", srid, "--compare")
    assert compared.returncode == 0, compared.stdout + compared.stderr
    assert "is identical to" in compared.stdout


def test_follow_goes_on_across_an_api_restart_with_no_entry_missed_or_repeated(
    served: ServedControlPlane,
) -> None:
    srid = json.loads(ok(airt(served, "submit", "human-input")))["shared_run_id"]
    follower = subprocess.Popen(
        [sys.executable, "-c", "import sys; from airuntime.cli.app import main; main()",
         "runs", "events", srid, "--follow", "--json"],
        env={"PATH": "/usr/bin:/bin", "AIRUNTIME_API_URL": served.url,
             "AIRUNTIME_API_TOKEN": "token-alice-a", "COLUMNS": "200"},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert follower.stdout is not None
        seen: list[dict[str, Any]] = []
        while not any(e["type"] == "input_requested" for e in seen):  # read up to the wait
            line = follower.stdout.readline()
            assert line, follower.communicate(timeout=10)
            seen.append(json.loads(line))
        # The API stops as a stopping control plane's does (its shutdown ends the
        # followed stream instead of waiting on it) and comes back on the same port.
        served.restart_api()
        ok(airt(served, "runs", "answer", srid, "approve", '{"approved": true}'))
        stdout, stderr = follower.communicate(timeout=120)
    finally:
        follower.kill()
    assert follower.returncode == 0, stderr
    entries = seen + [json.loads(line) for line in stdout.splitlines()]
    assert [e["seq"] for e in entries] == list(range(len(entries)))  # no gap, no repeat
    assert "execution_finalized" in [e["type"] for e in entries]
    flat = " ".join(stderr.split())
    assert "the stream ended before the run did; following again" in flat, flat
    assert "run ended: Succeeded" in flat, flat


def _http(served: ServedControlPlane) -> httpx.Client:
    headers = {"authorization": "Bearer token-alice-a"}
    return httpx.Client(base_url=served.url, headers=headers, timeout=30)


def _waiting_for_input(http: httpx.Client, srid: str) -> bool:
    steps = http.get(f"/v1/runs/{srid}").json().get("steps") or {}
    return bool(steps.get("approve", {}).get("status") == "input_wait")


def _answer_when_waiting(http: httpx.Client, srid: str, value: Any) -> None:
    wait_until(lambda: _waiting_for_input(http, srid), what=f"{srid} to wait for its answer")
    resp = http.post(f"/v1/runs/{srid}/input", json={"step": "approve", "value": value})
    assert resp.status_code == 200, resp.text


def _replay_an_answered_run(served: ServedControlPlane) -> None:
    """human-input waits for an answer: the original and its replay get the same one
    (the replay found through the listing's ``replay_of``) while --compare waits."""
    answer = {"approved": True, "by": "ana"}
    with _http(served) as http:
        srid = json.loads(ok(airt(served, "submit", "human-input")))["shared_run_id"]
        _answer_when_waiting(http, srid, answer)
        compare = subprocess.Popen(
            [sys.executable, "-c", "from airuntime.cli.app import main; main()",
             "runs", "replay", srid, "--compare"],
            env={"PATH": "/usr/bin:/bin", "AIRUNTIME_API_URL": served.url,
                 "AIRUNTIME_API_TOKEN": "token-alice-a"},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:

            def replays() -> list[str] | None:
                runs = http.get("/v1/runs").json()["runs"]
                return [r["shared_run_id"] for r in runs if r.get("replay_of") == srid] or None

            replay = wait_until(replays, what="the replay to be submitted")
            _answer_when_waiting(http, replay[0], answer)
            stdout, stderr = compare.communicate(timeout=120)
        finally:
            compare.kill()
    assert compare.returncode == 0, stdout + stderr
    assert f"replay {replay[0]} is identical to {srid}" in stdout


def test_replay_compare_reports_a_nondeterministic_handler_with_exit_1(
    served: ServedControlPlane, tmp_path: Path
) -> None:
    doc = {
        "id": "coin",
        "steps": [
            {
                "id": "token",
                "uses": "python",
                "with": {"callable": f"{NONDETERMINISTIC}:fresh_token"},
            }
        ],
    }
    path = tmp_path / "coin.yaml"
    path.write_text(json.dumps(doc))
    srid, result = submitted(served, str(path))
    ok(result)
    compared = airt(served, "runs", "replay", srid, "--compare")
    assert compared.returncode == 1, compared.stdout + compared.stderr
    assert "replay differs from the original" in compared.stdout
    assert "step token output:" in compared.stdout
    as_json = airt(served, "runs", "replay", srid, "--compare", "--json")
    assert as_json.returncode == 1
    diff = json.loads(as_json.stdout)["diff"]
    assert len(diff) == 1 and diff[0].startswith("step token output:")
