"""The web console in headless Chromium, against a real served control plane.

Each test signs in with an API token through the sign-in page and does what a person
does: sees its own tenant's runs only, watches a running run's steps change state
(live, over the run's SSE ledger stream), cancels a run, answers an input step,
drains the queue as an operator, is refused as a viewer. Accessibility basics are
checked on the same pages: every form control has a label, the keyboard reaches the
sign-in controls in order, the state colours keep their text readable (contrast >=
4.5:1, WCAG AA). Screenshots are written to ``artifacts/console/``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.console.conftest import ARTIFACTS, Stack, bearer
from tests.polling import wait_until
from tests.runs.archive import archive_and_expire

pytestmark = pytest.mark.timeout(180)

WAIT_MS = 30_000

FAN = {
    "id": "fan-out",
    "steps": [
        {"id": "root", "uses": "noop"},
        *[
            {"id": f"work_{i}", "uses": "sleep", "with": {"seconds": 1.5}, "depends_on": ["root"]}
            for i in range(4)
        ],
        {
            "id": "join",
            "uses": "sleep",
            "with": {"seconds": 2},
            "depends_on": [f"work_{i}" for i in range(4)],
        },
    ],
}
LONG = {"id": "long", "steps": [{"id": "wait", "uses": "sleep", "with": {"seconds": 120}}]}
ASK = {
    "id": "ask",
    "steps": [
        {"id": "first", "uses": "noop"},
        {"id": "approve", "uses": "input", "depends_on": ["first"]},
        {"id": "after", "uses": "echo", "with": {"value": "${steps.approve.output}"}},
    ],
}
TINY = {"id": "tiny", "steps": [{"id": "a", "uses": "noop"}]}

FOCUSED_JS = "() => document.activeElement.id || document.activeElement.textContent.trim()"
LABELLED_JS = """() => [...document.querySelectorAll('input, select, textarea')]
  .filter((el) => el.type !== 'hidden')
  .filter((el) => !(el.labels && el.labels.length) && !el.getAttribute('aria-label'))
  .map((el) => el.outerHTML)"""
CONTRAST_JS = """(pairs) => {
  const rgb = (s) => s.match(/[0-9.]+/g).slice(0, 3).map(Number);
  const lum = (c) => { const [r, g, b] = c.map((v) => { v /= 255;
    return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; });
    return 0.2126 * r + 0.7152 * g + 0.0722 * b; };
  const ratio = (a, b) => { const [x, y] = [lum(rgb(a)), lum(rgb(b))].sort((p, q) => q - p);
    return (x + 0.05) / (y + 0.05); };
  return pairs.map(([sel, bgProp, fgSel, fgProp]) => {
    const el = document.querySelector(sel);
    const fg = fgSel ? document.querySelector(fgSel) : el;
    return [sel, ratio(getComputedStyle(el)[bgProp], getComputedStyle(fg)[fgProp])];
  });
}"""


def sign_in(browser: Any, stack: Stack, who: str) -> Any:
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(f"{stack.url}/ui/runs")
    assert "/ui/login" in page.url, "a page asks for a token first"
    page.get_by_label("API token").fill(f"token-{who}")
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(re.compile(r"/ui/runs"))
    return page


def unlabelled(page: Any) -> list[str]:
    found: list[str] = page.evaluate(LABELLED_JS)
    return found


def wait_state(page: Any, step: str, state: str) -> None:
    """Until the graph draws ``step`` in ``state`` (a deadline, not an ordering sleep)."""
    css = state.replace("_", "-")
    try:
        page.locator(f'#dag .st-{css}[data-node="{step}"]').wait_for(
            state="attached", timeout=WAIT_MS
        )
    except Exception:
        page.screenshot(path=str(ARTIFACTS / f"failed-{step}-{state}.png"), full_page=True)
        raise


def tab_order(page: Any, presses: int) -> list[str]:
    """What the keyboard focuses, Tab after Tab: each element's id or its text."""
    order = []
    for _ in range(presses):
        page.keyboard.press("Tab")
        order.append(page.evaluate(FOCUSED_JS))
    return order


def test_sign_in_focus_order_and_a_wrong_token(browser: Any, stack: Stack, artifacts: Path) -> None:
    page = browser.new_page()
    page.goto(f"{stack.url}/ui/login")
    assert unlabelled(page) == []
    # The token field has autofocus; Tab goes on to the button.
    assert page.evaluate(FOCUSED_JS) == "token"
    assert tab_order(page, 1) == ["Sign in"]
    page.get_by_label("API token").fill("token-nobody-knows")
    page.get_by_role("button", name="Sign in").click()
    alert = page.get_by_role("alert")
    assert alert.inner_text() == "token: unknown token"
    assert page.get_by_label("API token").get_attribute("aria-invalid") == "true"
    cookies = page.context.cookies()
    assert not [c for c in cookies if c["name"] == "airt_console"], "no session for a bad token"
    page.screenshot(path=str(artifacts / "sign-in.png"))
    page.close()


def test_a_tenant_sees_its_own_runs_only(browser: Any, stack: Stack, artifacts: Path) -> None:
    mine = stack.submit(TINY, "alice-a")
    theirs = stack.submit(TINY, "bob-b")
    stack.dispatch((mine, "alice-a"), (theirs, "bob-b"))
    page = sign_in(browser, stack, "viewer-a")
    cookie = next(c for c in page.context.cookies() if c["name"] == "airt_console")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == "/ui"
    table = page.locator("#runs-table")
    table.get_by_role("link", name=mine).wait_for()
    assert theirs not in page.content()
    # Live: a run submitted after the page was drawn shows up without a reload.
    later = stack.submit(TINY, "alice-a")
    table.get_by_role("link", name=later).wait_for(timeout=WAIT_MS)
    # Filters: by pipeline and status.
    page.get_by_label("Pipeline").fill("no-such-pipeline")
    page.get_by_role("button", name="Filter").click()
    page.get_by_text("No runs match.").wait_for()
    assert unlabelled(page) == []
    page.goto(f"{stack.url}/ui/runs")
    page.screenshot(path=str(artifacts / "runs.png"))
    page.close()


def test_watch_a_running_run_change_state(browser: Any, stack: Stack, artifacts: Path) -> None:
    srid = stack.submit(FAN)
    page = sign_in(browser, stack, "alice-a")
    page.goto(f"{stack.url}/ui/runs/{srid}")
    assert page.locator("#run-status").inner_text() == "QueuedGlobally"
    stack.dispatch((srid, "alice-a"))
    # The page follows the run: the graph appears, steps go running, then completed.
    for i in range(4):
        wait_state(page, f"work_{i}", "running")
    page.screenshot(path=str(artifacts / "run-live.png"), full_page=True)
    # From here on the page is not reloaded until the run ends: the states are repainted
    # from the SSE-triggered state reads.
    page.evaluate("() => { window.sameDocument = true; }")
    wait_state(page, "join", "running")
    for i in range(4):
        wait_state(page, f"work_{i}", "completed")
    assert page.evaluate("() => window.sameDocument === true"), "repainted, not reloaded"
    wait_state(page, "join", "completed")
    page.locator("#run-status", has_text="Succeeded").wait_for(timeout=WAIT_MS)
    page.locator("#gantt svg.gantt").wait_for(timeout=WAIT_MS)
    page.locator("#ledger table").wait_for(timeout=WAIT_MS)
    assert page.locator("#gantt .bar").count() == 6, "one bar per attempt"
    states = ("pending", "ready", "running", "retry_wait", "input_wait", "completed", "failed",
              "skipped", "cancelled")  # fmt: skip
    ratios = page.evaluate(
        CONTRAST_JS,
        [[f'.legend [data-state="{s}"]', "backgroundColor", None, "color"] for s in states]
        + [['#dag [data-node="join"] rect', "fill", '#dag [data-node="join"] text', "fill"]],
    )
    low = [(sel, round(r, 2)) for sel, r in ratios if r < 4.5]
    assert not low, f"state colours below 4.5:1 contrast (WCAG AA): {low}"
    page.screenshot(path=str(artifacts / "run-done.png"), full_page=True)
    assert unlabelled(page) == []
    page.close()


def test_cancel_a_running_run(browser: Any, stack: Stack) -> None:
    srid = stack.submit(LONG)
    stack.dispatch((srid, "alice-a"))
    page = sign_in(browser, stack, "alice-a")
    page.goto(f"{stack.url}/ui/runs/{srid}")
    wait_state(page, "wait", "running")
    page.get_by_role("button", name="Cancel run").click()
    page.locator("#run-status", has_text="Cancelled").wait_for(timeout=WAIT_MS)
    assert stack.run(srid)["status"] == "Cancelled"
    page.close()


def test_pause_resume_and_replay(browser: Any, stack: Stack) -> None:
    srid = stack.submit(LONG)
    stack.dispatch((srid, "alice-a"))
    page = sign_in(browser, stack, "alice-a")
    page.goto(f"{stack.url}/ui/runs/{srid}")
    wait_state(page, "wait", "running")
    page.get_by_role("button", name="Pause").click()
    page.get_by_role("button", name="Resume").wait_for(timeout=WAIT_MS)
    assert page.locator("#ex-status").inner_text() in ("Pausing", "Paused")
    page.get_by_role("button", name="Resume").click()
    page.get_by_role("button", name="Pause").wait_for(timeout=WAIT_MS)
    assert page.locator("#ex-status").inner_text() == "Running"
    page.get_by_role("button", name="Cancel run").click()
    page.locator("#run-status", has_text="Cancelled").wait_for(timeout=WAIT_MS)
    # A finished run can be replayed: the new run links back to it.
    page.get_by_role("button", name="Replay").click()
    page.locator("#done", has_text="replay").wait_for(timeout=WAIT_MS)
    replay = page.url.split("/ui/runs/", 1)[1].split("?", 1)[0]
    assert replay != srid and stack.run(replay)["replay_of"] == srid
    assert page.get_by_role("link", name=srid).count() == 1
    stack.api.post(f"/v1/runs/{replay}/cancel", headers=bearer("alice-a"))
    page.close()


def test_answer_an_input_step(browser: Any, stack: Stack, artifacts: Path) -> None:
    srid = stack.submit(ASK, "sub-a")
    stack.dispatch((srid, "sub-a"))
    page = sign_in(browser, stack, "sub-a")
    page.goto(f"{stack.url}/ui/runs/{srid}")
    answer = page.get_by_label("Answer for input step approve")
    answer.wait_for(timeout=WAIT_MS)
    assert page.get_by_role("button", name="Cancel run").count() == 0, "submitters cannot cancel"
    answer.fill("ship it")
    page.screenshot(path=str(artifacts / "run-input.png"), full_page=True)
    page.get_by_role("button", name="Send answer").click()
    page.locator("#run-status", has_text="Succeeded").wait_for(timeout=WAIT_MS)
    steps = stack.run(srid)["steps"]
    assert steps["approve"]["output"] == "ship it"
    assert steps["after"]["output"] == "ship it"
    page.close()


def test_drain_as_operator(browser: Any, stack: Stack, artifacts: Path) -> None:
    stack.settle()
    queued = [stack.submit(TINY) for _ in range(2)]
    page = sign_in(browser, stack, "alice-a")
    page.goto(f"{stack.url}/ui/queue")
    # Keyboard order follows the page: skip link, navigation, sign out, drain, the items.
    assert tab_order(page, 7) == [
        "Skip to content", "Runs", "Queue", "Instances", "Sign out", "btn-drain", queued[0]
    ]  # fmt: skip
    assert page.locator('tr[data-tenant="tenant-a"] .depth').inner_text() == "2"
    for srid in queued:
        page.get_by_role("link", name=srid).wait_for()
    page.screenshot(path=str(artifacts / "queue.png"), full_page=True)
    page.get_by_role("button", name="Drain the queue").click()
    done = page.locator("#drained")
    done.wait_for(timeout=WAIT_MS)
    drained = re.match(r"Drain done: (\d+) dispatched, (\d+) failed", done.inner_text())
    assert drained and int(drained[1]) >= 1, done.inner_text()
    # What the drain dispatched left the queue: the page shows what is still pending.
    left = page.locator('tr[data-tenant="tenant-a"] .depth')
    assert (int(left.inner_text()) if left.count() else 0) == 2 - int(drained[1])
    dispatched = [r for r in queued if stack.run(r)["status"] != "QueuedGlobally"]
    assert len(dispatched) == int(drained[1])
    page.close()


def test_a_viewer_is_refused(browser: Any, stack: Stack, artifacts: Path) -> None:
    srid = stack.submit(LONG)
    stack.dispatch((srid, "alice-a"))
    page = sign_in(browser, stack, "viewer-a")
    page.goto(f"{stack.url}/ui/runs/{srid}")
    page.locator("#no-actions").wait_for()
    for name in ("Cancel run", "Pause", "Replay"):
        assert page.get_by_role("button", name=name).count() == 0, name
    # Forcing the request anyway (with the session's own CSRF token) is refused as the
    # API refuses it, and the run goes on.
    status = page.evaluate(
        """async (path) => {
          const csrf = document.querySelector('meta[name=csrf-token]').content;
          const r = await fetch(path, {method: 'POST', body: new URLSearchParams({csrf}),
                                       headers: {'content-type':
                                         'application/x-www-form-urlencoded'}});
          return [r.status, await r.text()];
        }""",
        f"/ui/runs/{srid}/cancel",
    )
    assert status[0] == 403 and "lacks the &#39;cancel&#39; capability" in status[1], status
    page.goto(f"{stack.url}/ui/queue")
    assert page.get_by_role("button", name="Drain the queue").count() == 0
    assert stack.run(srid)["status"] == "Dispatched"
    # Another tenant's run is "not found", as in the API.
    other = sign_in(browser, stack, "bob-b")
    other.goto(f"{stack.url}/ui/runs/{srid}")
    assert other.get_by_role("alert").inner_text() == f"shared run {srid!r} not found"
    other.screenshot(path=str(artifacts / "refused.png"))
    stack.api.post(f"/v1/runs/{srid}/cancel", headers=bearer("alice-a"))
    other.close()
    page.close()


def test_an_archived_run_reads_as_it_did_hot(browser: Any, stack: Stack) -> None:
    srid = stack.submit(FAN)
    stack.dispatch((srid, "alice-a"))
    wait_until(lambda: stack.run(srid)["status"] == "Succeeded", what="the run to end")
    page = sign_in(browser, stack, "alice-a")
    page.goto(f"{stack.url}/ui/runs/{srid}")
    page.locator("#gantt svg.gantt").wait_for(timeout=WAIT_MS)
    page.locator("#ledger table").wait_for(timeout=WAIT_MS)
    hot = page.locator("main").inner_text()
    stack.served.call(lambda redis, store: archive_and_expire(redis, store, srid))
    assert stack.api.get(f"/v1/runs/{srid}", headers=bearer("alice-a")).json()["status"] == (
        "Succeeded"
    )
    page.goto(f"{stack.url}/ui/runs?pipeline=fan-out")
    page.locator("#runs-table").get_by_role("link", name=srid).wait_for()
    page.goto(f"{stack.url}/ui/runs/{srid}")
    page.locator("#gantt svg.gantt").wait_for(timeout=WAIT_MS)
    page.locator("#ledger table").wait_for(timeout=WAIT_MS)
    wait_state(page, "join", "completed")
    assert page.locator("main").inner_text() == hot, "the same page from the archive"
    page.close()


def test_instances_page(browser: Any, stack: Stack, artifacts: Path) -> None:
    page = sign_in(browser, stack, "alice-a")
    page.goto(f"{stack.url}/ui/instances")
    instances = stack.api.get("/v1/instances", headers=bearer("alice-a")).json()
    assert instances
    for inst in instances:
        page.get_by_role("heading", name=re.compile(re.escape(inst["instance_id"]))).wait_for()
    for field in instances[0]["capacity"]:
        if field != "snapshot_at_ms":
            assert page.get_by_role("rowheader", name=field, exact=True).count() == len(instances)
    page.screenshot(path=str(artifacts / "instances.png"), full_page=True)
    page.close()


def test_instances_page_shows_the_model_token_budget(browser: Any, stack: Stack) -> None:
    """Not limited until the tenant has a budget; then the window's use, what calls hold,
    what is left and when it renews, as the API answers them."""
    from airuntime.engine.model_budget import BudgetWindow, ModelBudgets, ModelTokenBudget
    from airuntime.fleet.registry import Registry

    page = sign_in(browser, stack, "alice-a")
    page.goto(f"{stack.url}/ui/instances")
    assert page.locator("p.model-tokens").inner_text() == "Model tokens: not limited."

    async def budget(redis: Any, _history: Any) -> Any:
        registry = Registry(redis)
        before = await registry.tenant("tenant-a")
        limited = ModelTokenBudget(tokens=250_000, window=BudgetWindow.MONTH)
        await registry.put_tenant(before.model_copy(update={"model_token_budget": limited}))
        budgets = ModelBudgets(redis)
        held = await budgets.reserve("tenant-a", 40_000)
        assert held is not None
        await budgets.settle(held, 31_415)
        assert await budgets.reserve("tenant-a", 2_048) is not None
        return before

    before = stack.served.call(budget)
    try:
        page.reload()
        usage = stack.api.get("/v1/tenants/tenant-a/model-usage", headers=bearer("alice-a"))
        shown = page.locator("p.model-tokens").inner_text()
        body = usage.json()
        assert (body["used"], body["reserved"], body["remaining"]) == (31_415, 2_048, 216_537)
        assert shown.startswith("Model tokens: 31,415 of 250,000 used this month (UTC), 2,048 "
                                "held by calls going on, 216,537 left; renews "), shown  # fmt: skip
    finally:

        async def restore(redis: Any, _history: Any) -> None:
            await Registry(redis).put_tenant(before)

        stack.served.call(restore)
        page.close()
