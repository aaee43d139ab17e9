"""A real HTTP service on loopback that answers with the ``Authorization`` header it got,
as a service that echoes a credential in a reply or an error would: ``/headers`` JSON
``{"authorization": ...}``, ``/fail`` a 500 whose text quotes it (``/fail-long``: after
180 dots), anything else a 400
whose text does. Served by a thread of the test process; ``seen`` keeps each request's
header, in order."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Echo:
    port: int = 0
    seen: list[str] = field(default_factory=list)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@contextmanager
def echo_service() -> Iterator[Echo]:
    state = Echo()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            got = self.headers.get("authorization", "")
            state.seen.append(got)
            if self.path == "/headers":
                status, body, kind = 200, json.dumps({"authorization": got}), "application/json"
            elif self.path == "/fail":
                status, body, kind = 500, f"upstream refused {got}", "text/plain"
            elif self.path == "/fail-long":  # the header from the 182nd character on
                status, body, kind = 500, "." * 180 + f" {got}", "text/plain"
            else:
                status, body, kind = 400, f"bad credential: {got}", "text/plain"
            data = body.encode()
            self.send_response(status)
            self.send_header("content-type", kind)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.port = httpd.server_address[1]
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield state
    finally:
        httpd.shutdown()
        httpd.server_close()
