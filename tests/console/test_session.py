"""The console's sign-in, CSRF and origin checks, and its answers to hostile input, over
HTTP against the served control plane (no browser: these are the requests a browser, or
a page of another origin, could send)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from airuntime.control_plane.console.session import COOKIE, csrf_token
from tests.console.conftest import Stack, bearer

TINY = {"id": "tiny", "steps": [{"id": "a", "uses": "noop"}]}
LONG = {"id": "long", "steps": [{"id": "wait", "uses": "sleep", "with": {"seconds": 120}}]}


@pytest.fixture
def alice(stack: Stack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stack.url, timeout=30) as client:
        resp = client.post("/ui/login", data={"token": "token-alice-a", "next": "/ui/queue"})
        assert resp.status_code == 303 and resp.headers["location"] == "/ui/queue"
        yield client


def fresh(stack: Stack) -> httpx.Client:
    """A client with an empty cookie jar."""
    return httpx.Client(base_url=stack.url, timeout=30)


def test_the_cookie_is_httponly_strict_and_scoped(stack: Stack) -> None:
    with fresh(stack) as client:
        resp = client.post("/ui/login", data={"token": "token-alice-a"})
    header = resp.headers["set-cookie"].lower()
    assert f"{COOKIE}=token-alice-a" in header
    for flag in ("httponly", "samesite=strict", "path=/ui"):
        assert flag in header, header
    assert resp.headers["location"] == "/ui/runs"


@pytest.mark.parametrize("target", ["https://evil.example/", "//evil.example/ui", "/v1/runs"])
def test_sign_in_never_redirects_off_the_console(stack: Stack, target: str) -> None:
    with fresh(stack) as client:
        resp = client.post("/ui/login", data={"token": "token-alice-a", "next": target})
    assert resp.status_code == 303 and resp.headers["location"] == "/ui/runs"


def test_the_apis_address_opened_in_a_browser_leads_to_the_console(stack: Stack) -> None:
    with fresh(stack) as client:
        root = client.get("/")
        assert root.status_code == 303 and root.headers["location"] == "/ui/runs"
        page = client.get("/", follow_redirects=True, headers={"accept": "text/html"})
    assert page.status_code == 200 and page.url.path == "/ui/login", page.url


def test_a_cookie_does_not_authorize_the_api_nor_a_bearer_the_console(stack: Stack) -> None:
    cookie = {"cookie": f"{COOKIE}=token-alice-a"}
    with fresh(stack) as client:
        assert client.get("/v1/runs", headers=cookie).status_code == 401
        assert client.get("/ui/runs", headers=bearer("alice-a")).status_code == 401


def test_posts_need_the_csrf_token_and_the_same_origin(stack: Stack, alice: httpx.Client) -> None:
    srid = stack.submit(LONG)
    stack.dispatch((srid, "alice-a"))
    path = f"/ui/runs/{srid}/cancel"
    good = csrf_token("token-alice-a")
    refusals = [
        alice.post(path, data={}),
        alice.post(path, data={"csrf": csrf_token("token-bob-b")}),
        alice.post(path, data={"csrf": good}, headers={"origin": "https://evil.example"}),
        alice.post(path, data={"csrf": good}, headers={"sec-fetch-site": "cross-site"}),
    ]
    assert [r.status_code for r in refusals] == [403] * 4
    assert "CSRF token" in refusals[0].text and "evil.example" in refusals[2].text
    assert stack.run(srid)["status"] == "Dispatched", "nothing was cancelled"
    done = alice.post(path, data={"csrf": good}, headers={"origin": stack.url})
    assert done.status_code == 303 and done.headers["location"].endswith("?done=cancel")
    assert stack.run(srid)["status"] in ("Dispatched", "Cancelled")


@pytest.mark.parametrize(
    ("path", "status", "names"),
    [
        ("/ui/runs?status=Nope", 422, "status: 'Nope'"),
        ("/ui/runs?created_from=yesterday", 422, "created_from: 'yesterday'"),
        ("/ui/runs?cursor=not-a-cursor", 400, "cursor:"),
        ("/ui/runs/sr-00000000000000000000000000000000", 404, "not found"),
    ],
)
def test_hostile_reads_are_refused_naming_the_field(
    alice: httpx.Client, path: str, status: int, names: str
) -> None:
    resp = alice.get(path)
    assert resp.status_code == status, resp.text
    assert names in resp.text.replace("&#39;", "'")


def test_hostile_answers_are_refused_naming_the_field(stack: Stack, alice: httpx.Client) -> None:
    srid = stack.submit(TINY)
    csrf = csrf_token("token-alice-a")
    path = f"/ui/runs/{srid}/input"
    cases = [
        ({"csrf": csrf, "step": "a", "value": "{", "as": "json"}, 422, "value: not JSON"),
        ({"csrf": csrf, "step": "a", "value": "x", "as": "xml"}, 422, "as: 'xml'"),
        ({"csrf": csrf, "step": "", "value": "x"}, 422, "step:"),
        ({"csrf": csrf, "step": "a", "value": "x"}, 409, "no execution yet"),
    ]
    for fields, status, names in cases:
        resp = alice.post(path, data=fields)
        assert resp.status_code == status, (fields, resp.text)
        assert names in resp.text.replace("&#39;", "'"), (fields, resp.text)
    form = {"content-type": "application/x-www-form-urlencoded"}
    repeated = alice.post(path, content=f"csrf={csrf}&step=a&step=b", headers=form)
    assert repeated.status_code == 422 and "given more than once" in repeated.text
    as_json = alice.post(path, json={"csrf": csrf, "step": "a"})
    assert as_json.status_code == 415
    assert alice.post(f"/ui/runs/{srid}/explode", data={"csrf": csrf}).status_code == 422
    stack.settle()


def test_sign_out_needs_the_csrf_token_and_drops_the_cookie(stack: Stack) -> None:
    with fresh(stack) as client:
        client.post("/ui/login", data={"token": "token-viewer-a"})
        assert client.get("/ui/runs").status_code == 200
        assert client.post("/ui/logout", data={}).status_code == 403
        assert client.get("/ui/runs").status_code == 200, "still signed in"
        out = client.post("/ui/logout", data={"csrf": csrf_token("token-viewer-a")})
        assert out.status_code == 303 and out.headers["location"] == "/ui/login"
        assert COOKIE not in client.cookies
        assert client.get("/ui/runs").status_code == 401
        page = client.get("/ui/runs?pipeline=x", headers={"accept": "text/html"})
        assert page.status_code == 303
        assert page.headers["location"] == "/ui/login?next=/ui/runs%3Fpipeline%3Dx"
