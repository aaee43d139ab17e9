"""The web console, served by the control plane at ``/ui`` (same port, tokens and roles).

Why this exists: people look at runs in a browser. The console is server-rendered
Jinja2 templates with one small plain ES module (no JS library, no CDN, no external
font: everything it needs ships in this package, so it works in an air-gapped
cluster). Pages read through the API's own route functions with the signed-in
principal (:mod:`.pages`), buttons call them (:mod:`.actions`), the sign-in cookie and
CSRF checks are :mod:`.session`, and the DAG and Gantt geometry are computed in Python
(:mod:`.layout`, :mod:`.charts`). :func:`install` adds it to the API app.
"""

from __future__ import annotations

from urllib.parse import quote

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles

from airuntime.control_plane.console import actions, pages
from airuntime.control_plane.console.rendering import STATIC_DIR
from airuntime.control_plane.console.session import PREFIX, SignInRequired

__all__ = ["install"]


def install(app: FastAPI) -> None:
    """Serve the console at ``/ui`` on ``app`` (the control plane's API app)."""
    app.include_router(actions.router)
    app.include_router(pages.router)
    app.mount(f"{PREFIX}/static", StaticFiles(directory=STATIC_DIR), name="console-static")

    @app.get("/", include_in_schema=False)
    async def _root() -> RedirectResponse:
        """The API's address opened in a browser: the console (it was a 404)."""
        return RedirectResponse(f"{PREFIX}/runs", status_code=303)

    @app.exception_handler(SignInRequired)
    async def _sign_in(request: Request, exc: SignInRequired) -> Response:
        wants_page = request.method == "GET" and "text/html" in request.headers.get("accept", "")
        if wants_page:
            target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
            return RedirectResponse(f"{PREFIX}/login?next={_quote(target)}", status_code=303)
        return JSONResponse({"detail": "sign in to the console first"}, status_code=401)


def _quote(path: str) -> str:
    return quote(path[:512], safe="/")
