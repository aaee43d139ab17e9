"""``http`` steps never reach internal addresses unless the platform allows them: checked on
the address actually connected to, for every redirect hop, against real local servers."""

from __future__ import annotations

import ipaddress
import json
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from airuntime.engine.handlers import StepContext, StepFailed, builtin
from airuntime.engine.handlers.egress import (
    AddressClass,
    EgressPolicy,
    EgressRefused,
    GuardedTransport,
    classify,
)

ALLOW = "AIRUNTIME_HTTP_HANDLER_ALLOW"
DENY = "AIRUNTIME_HTTP_HANDLER_DENY_CIDRS"


@dataclass
class Server:
    """A real HTTP server on one loopback address; ``seen`` lists the paths it served."""

    host: str
    port: int = 0
    seen: list[str] = field(default_factory=list)
    redirect_to: str = ""

    @property
    def base(self) -> str:
        return f"http://{self.host}:{self.port}"


def _handler(server: Server) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            server.seen.append(self.path)
            if self.path == "/redirect":
                self.send_response(302)
                self.send_header("Location", server.redirect_to)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            body = json.dumps({"served_by": server.host}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


@pytest.fixture
def servers() -> Iterator[tuple[Server, Server]]:
    """One server on 127.0.0.1 and one on 127.0.0.2 (both loopback)."""
    made: list[ThreadingHTTPServer] = []
    out: list[Server] = []
    for host in ("127.0.0.1", "127.0.0.2"):
        s = Server(host)
        httpd = ThreadingHTTPServer((host, 0), _handler(s))
        s.port = httpd.server_address[1]
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        made.append(httpd)
        out.append(s)
    yield out[0], out[1]
    for httpd in made:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture(autouse=True)
def no_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ALLOW, raising=False)
    monkeypatch.delenv(DENY, raising=False)


async def call(url: str, **extra: Any) -> Any:
    ctx = StepContext(
        execution_id="e", step_id="fetch", attempt=1, inputs={"url": url, **extra}, pipeline_id="p"
    )
    return await builtin.http_request(ctx)


async def test_loopback_is_refused_naming_host_and_class(servers: tuple[Server, Server]) -> None:
    local, _ = servers
    with pytest.raises(StepFailed) as info:
        await call(f"{local.base}/ok")
    message = str(info.value)
    assert f"GET {local.base}/ok refused: host '127.0.0.1' is a loopback address" in message
    assert info.value.non_retryable
    assert local.seen == [], "no request reached the server"


async def test_an_allowlisted_network_is_reached(
    servers: tuple[Server, Server], monkeypatch: pytest.MonkeyPatch
) -> None:
    local, _ = servers
    monkeypatch.setenv(ALLOW, "127.0.0.1/32")
    assert await call(f"{local.base}/ok") == {"status": 200, "json": {"served_by": "127.0.0.1"}}
    assert local.seen == ["/ok"]


async def test_a_host_name_resolving_to_loopback_is_refused(
    servers: tuple[Server, Server], monkeypatch: pytest.MonkeyPatch
) -> None:
    local, _ = servers
    url = f"http://localhost:{local.port}/ok"
    with pytest.raises(StepFailed, match=r"host 'localhost' resolves to .*, which is a loopback"):
        await call(url)
    assert local.seen == []
    monkeypatch.setenv(ALLOW, "localhost")
    assert (await call(url))["status"] == 200


async def test_a_redirect_to_loopback_is_refused_at_the_hop(
    servers: tuple[Server, Server], monkeypatch: pytest.MonkeyPatch
) -> None:
    target, front = servers
    front.redirect_to = f"{target.base}/secret"
    monkeypatch.setenv(ALLOW, "127.0.0.2/32")  # the first hop only
    with pytest.raises(StepFailed, match=r"host '127\.0\.0\.1' is a loopback address"):
        await call(f"{front.base}/redirect", follow_redirects=True)
    assert front.seen == ["/redirect"] and target.seen == [], "the second hop never connected"
    # Without follow_redirects the 302 is the answer.
    assert (await call(f"{front.base}/redirect"))["status"] == 302
    assert target.seen == []


async def test_the_connected_address_is_the_one_checked(servers: tuple[Server, Server]) -> None:
    """DNS rebinding: the answer that is vetted is the one connected to (never looked up
    again), and a mixed answer (public + internal) is refused as a whole."""
    _, allowed = servers
    answers: list[Sequence[str]] = [["93.184.215.14", "127.0.0.1"], ["127.0.0.2"]]

    async def resolve(host: str, port: int) -> Sequence[str]:
        return answers.pop(0)

    policy = EgressPolicy(allowed=(ipaddress.ip_network("127.0.0.2/32"),))
    async with httpx.AsyncClient(transport=GuardedTransport(policy, resolve)) as client:
        with pytest.raises(EgressRefused, match=r"resolves to 127\.0\.0\.1, which is a loopback"):
            await client.get(f"http://rebind.invalid:{allowed.port}/first")
        # rebind.invalid cannot resolve for real: the request reaching the server proves
        # the connection went to the vetted address.
        response = await client.get(f"http://rebind.invalid:{allowed.port}/second")
    assert response.json() == {"served_by": "127.0.0.2"}
    assert allowed.seen == ["/second"] and answers == []


async def test_metadata_and_configured_denials(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(StepFailed, match=r"'169\.254\.169\.254' is a cloud metadata address"):
        await call("http://169.254.169.254/latest/meta-data/")
    monkeypatch.setenv(DENY, "198.51.100.0/24, 8.8.8.0/24")
    with pytest.raises(StepFailed, match="denied by AIRUNTIME_HTTP_HANDLER_DENY_CIDRS"):
        await call("http://8.8.8.8/")


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("127.0.0.1", AddressClass.LOOPBACK),
        ("::1", AddressClass.LOOPBACK),
        ("10.1.2.3", AddressClass.PRIVATE),
        ("172.16.0.1", AddressClass.PRIVATE),
        ("192.168.1.1", AddressClass.PRIVATE),
        ("100.64.0.1", AddressClass.SHARED),
        ("169.254.169.254", AddressClass.METADATA),
        ("fd00:ec2::254", AddressClass.METADATA),
        ("100.100.100.200", AddressClass.METADATA),
        ("169.254.1.1", AddressClass.LINK_LOCAL),
        ("fe80::1", AddressClass.LINK_LOCAL),
        ("fd12:3456::1", AddressClass.UNIQUE_LOCAL),
        ("0.0.0.0", AddressClass.UNSPECIFIED),
        ("::", AddressClass.UNSPECIFIED),
        ("224.0.0.1", AddressClass.MULTICAST),
        ("ff02::1", AddressClass.MULTICAST),
        ("::ffff:127.0.0.1", AddressClass.LOOPBACK),
        ("64:ff9b::a00:1", AddressClass.PRIVATE),
        ("2002:c0a8:101::1", AddressClass.PRIVATE),
        ("240.0.0.1", AddressClass.NOT_GLOBAL),
        ("192.0.2.1", AddressClass.NOT_GLOBAL),
        ("8.8.8.8", None),
        ("2001:4860:4860::8888", None),
    ],
)
def test_address_classes(address: str, expected: AddressClass | None) -> None:
    assert classify(ipaddress.ip_address(address)) == expected


def test_allowed_networks_win_and_denied_ones_add() -> None:
    ten = ipaddress.ip_network("10.0.0.0/8")
    google = ipaddress.ip_network("8.8.8.0/24")
    assert classify(ipaddress.ip_address("10.9.9.9"), allowed=[ten]) is None
    assert classify(ipaddress.ip_address("8.8.8.8"), denied=[google]) is AddressClass.CONFIGURED


# -- at submit: a literal internal address never compiles ----------------------------------


def _compile_urls(*urls: str) -> str:
    """The problems compiling one ``http`` step per url reports ('' = it compiles)."""
    from airuntime.engine.pipeline.compile import compile_pipeline
    from airuntime.engine.pipeline.problems import PipelineError
    from airuntime.engine.pipeline.spec import PipelineSpec

    steps = [{"id": f"s{i}", "uses": "http", "with": {"url": u}} for i, u in enumerate(urls)]
    spec = PipelineSpec.model_validate({"id": "p", "inputs": {"host": "x"}, "steps": steps})
    try:
        compile_pipeline(spec)
    except PipelineError as exc:
        return str(exc)
    return ""


@pytest.mark.parametrize(
    ("url", "named"),
    [
        ("http://127.0.0.1:6379/", "a loopback address"),
        ("http://169.254.169.254/latest/meta-data/", "a cloud metadata address"),
        ("http://localhost:8080/v1/settings", "resolves to 127.0.0.1, which is a loopback"),
        ("http://[::1]/", "a loopback address"),
        ("http://10.1.2.3/", "a private (RFC 1918) address"),
        ("http://[::ffff:169.254.169.254]/", "a cloud metadata address"),
    ],
)
def test_a_literal_internal_url_is_refused_at_compile_naming_step_and_url(
    url: str, named: str
) -> None:
    problems = _compile_urls(url)
    assert "steps[0].with.url" in problems and "step 's0'" in problems, problems
    assert repr(url) in problems and named in problems, problems


def test_names_references_and_allowed_networks_are_left_to_the_handler(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert _compile_urls("https://api.example.com/x", "http://${inputs.host}/") == ""
    monkeypatch.setenv(ALLOW, "127.0.0.1/32")
    assert _compile_urls("http://127.0.0.1:6379/") == ""
    assert "169.254.169.254" in _compile_urls("http://169.254.169.254/")
