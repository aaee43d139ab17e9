"""The console's Jinja2 environment, its filters, and the HTML error page.

Why this exists: every console page is a server-rendered template (autoescaped) over
the API's own answers; the filters here are the few presentation rules the templates
share (times in UTC, ages, JSON shown to a person, state colours' CSS class names), so
no page formats a value its own way.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from fastapi import HTTPException, Request
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates

from airuntime.control_plane.console.session import PREFIX, Session
from airuntime.control_plane.service import ControlPlaneError

__all__ = ["STATIC_DIR", "error_page", "page", "templates"]

HERE: Final = Path(__file__).parent
STATIC_DIR: Final = HERE / "static"
JSON_SHOWN: Final = 4000
"""A JSON value longer than this is cut in the page (the API has it whole)."""


def _utc(ms: int | None) -> str:
    if not ms:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


def age(ms: int | None, now_ms: int | None = None) -> str:
    """How long ago ``ms`` was, for a person (``3.2 s``, ``4 min``, ``2 h``)."""
    if not ms:
        return "-"
    seconds = max(0.0, ((now_ms or int(time.time() * 1000)) - ms) / 1000)
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _count(value: int | None) -> str:
    """A count with thousands separators (``1,234``), ``-`` for none."""
    return "-" if value is None else f"{value:,}"


def _json(value: Any) -> str:
    text = json.dumps(value, indent=2, ensure_ascii=False, default=str)
    return text if len(text) <= JSON_SHOWN else text[:JSON_SHOWN] + "\n... (cut)"


def state_class(status: str | None) -> str:
    """The CSS class of a step or run state (``st-running``, ``st-failed``, ...)."""
    return "st-" + (status or "unknown").lower().replace("_", "-")


templates = Jinja2Templates(directory=str(HERE / "templates"))
templates.env.filters.update(utc=_utc, age=age, pretty=_json, state=state_class, count=_count)
templates.env.globals.update(prefix=PREFIX)


def page(
    request: Request, name: str, s: Session | None, status_code: int = 200, **values: Any
) -> HTMLResponse:
    """A full page (or fragment) rendered for the signed-in session ``s``."""
    values.update(request=request, session=s, now_ms=int(time.time() * 1000))
    return templates.TemplateResponse(request, name, values, status_code=status_code)


REFUSED: Final = (HTTPException, ControlPlaneError)
"""What the API's route functions refuse with: FastAPI's own, or the operations' errors
(each carrying its HTTP status, as the API's exception handlers answer them)."""


def refused_page(
    request: Request, s: Session | None, exc: HTTPException | ControlPlaneError
) -> HTMLResponse:
    """The error page of a refused console request, with the API's status and message."""
    if isinstance(exc, HTTPException):
        return error_page(request, s, exc.status_code, exc.detail)
    return error_page(request, s, exc.status, str(exc))


def error_page(request: Request, s: Session | None, status: int, detail: Any) -> HTMLResponse:
    """An HTML refusal with the API's status and message."""
    if isinstance(detail, list):
        detail = "; ".join(
            f"{'.'.join(str(p) for p in d.get('loc', ()))}: {d.get('msg')}"
            if isinstance(d, dict)
            else str(d)
            for d in detail
        )
    return page(request, "error.html", s, status_code=status, status=status, detail=str(detail))
