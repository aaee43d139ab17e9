"""A real HTTP server speaking the two model APIs the ``model`` handler calls.

It answers ``POST /v1/chat/completions`` (OpenAI) and ``POST /v1/messages`` (Anthropic)
as those services do: by default with a reply derived from the request (the last user
message, echoed), or with the answers queued in :attr:`ModelServer.answers` (status and
body), one per request. Every request is kept (path, headers, JSON body) for the tests
to read. Served on loopback by a thread of the test process.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class ModelServer:
    port: int = 0
    seen: list[Seen] = field(default_factory=list)
    answers: deque[tuple[int, Any] | tuple[int, Any, dict[str, str]]] = field(default_factory=deque)
    """Queued answers: (status, body[, headers]); a str body is sent as it is, anything
    else as JSON."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def openai_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def anthropic_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def answer(self, path: str, body: Any) -> tuple[int, Any, dict[str, str]]:
        with self.lock:
            if self.answers:
                status, reply, *headers = self.answers.popleft()
                return status, reply, headers[0] if headers else {}
        reply = openai_reply(body) if path.endswith("/chat/completions") else claude(body)
        return 200, reply, {}


def _last_user(messages: list[dict[str, Any]]) -> str:
    return next(str(m["content"]) for m in reversed(messages) if m["role"] == "user")


def openai_reply(request: dict[str, Any]) -> dict[str, Any]:
    """What an OpenAI-compatible server answers: the last user message, echoed."""
    text = _last_user(request["messages"])
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": f"{request['model']}-2026",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": f"echo: {text}"},
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": sum(len(m["content"].split()) for m in request["messages"]),
            "completion_tokens": len(text.split()) + 1,
            "total_tokens": 0,
        },
    }


def openai_text(text: str) -> dict[str, Any]:
    """An OpenAI-compatible answer whose reply is ``text``."""
    return {
        "model": "m",
        "choices": [{"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
    }


def claude(request: dict[str, Any]) -> dict[str, Any]:
    """What Anthropic's Messages API answers: the last user message, echoed."""
    text = _last_user(request["messages"])
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": request["model"],
        "content": [{"type": "text", "text": "echo: "}, {"type": "text", "text": text}],
        "stop_reason": "end_turn",
        "usage": {"input_tokens": len(text.split()), "output_tokens": len(text.split()) + 1},
    }


def _handler(server: ModelServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            body = json.loads(self.rfile.read(length) or b"null")
            with server.lock:
                server.seen.append(Seen(self.path, dict(self.headers.items()), body))
            status, reply, headers = server.answer(self.path, body)
            data = reply.encode() if isinstance(reply, str) else json.dumps(reply).encode()
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


@contextmanager
def model_server() -> Iterator[ModelServer]:
    server = ModelServer()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(server))
    server.port = httpd.server_address[1]
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()
