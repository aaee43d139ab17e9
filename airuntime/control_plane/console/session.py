"""Who is looking at the console: the sign-in cookie, its CSRF token, same-origin checks.

Why this exists: the console is a browser over the same tokens and roles as the API,
but a browser must not keep a bearer token where scripts can read it. Signing in puts
the token in an ``HttpOnly``, ``SameSite=Strict`` cookie scoped to ``/ui`` (``Secure``
when the request came over HTTPS); every request authenticates it with the API's own
:class:`~airuntime.control_plane.rbac.Authenticator`, so roles and the tenant are the
API's. The API itself keeps bearer headers only: a cookie never authorizes ``/v1``.

Every state-changing request (the console's POST forms and fetches) must carry the
session's CSRF token, an HMAC of a fixed label keyed by the session token: a page of
another origin can neither read it (the cookie is HttpOnly, the pages are same-origin)
nor compute it, and it needs no server-side state, so any control-plane replica checks
it. On top of that a POST whose ``Origin`` is another origin, or whose
``Sec-Fetch-Site`` says it came from another site, is refused before anything runs.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Annotated, Final
from urllib.parse import parse_qs, urlsplit

from fastapi import Depends, HTTPException, Request

from airuntime.control_plane.api.deps import ApiContext, Context
from airuntime.control_plane.rbac import Capability, Principal

__all__ = [
    "COOKIE",
    "PREFIX",
    "Session",
    "SignInRequired",
    "SignedIn",
    "check_csrf",
    "csrf_token",
    "form",
    "guarded_form",
    "require",
    "same_origin",
]

PREFIX: Final = "/ui"
COOKIE: Final = "airt_console"
"""The session cookie: the bearer token itself, HttpOnly, SameSite=Strict, Path=/ui."""
CSRF_FIELD: Final = "csrf"
CSRF_HEADER: Final = "x-csrf-token"
_CSRF_LABEL: Final = b"airuntime-console-csrf-v1"


def csrf_token(token: str) -> str:
    """The CSRF token of a session (an HMAC keyed by its bearer token)."""
    return hmac.new(token.encode(), _CSRF_LABEL, hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class Session:
    """A signed-in browser: the principal its token maps to, and its CSRF token."""

    who: Principal
    csrf: str
    context: ApiContext

    def can(self, capability: Capability | str) -> bool:
        return self.who.can(Capability(capability))


class SignInRequired(Exception):
    """No session cookie, or one the authenticator does not know (401; a page redirects
    to the sign-in page)."""


async def session(request: Request, context: Context) -> Session:
    token = request.cookies.get(COOKIE)
    who = context.auth.authenticate(token) if token else None
    if who is None or token is None:
        raise SignInRequired()
    return Session(who, csrf_token(token), context)


SignedIn = Annotated[Session, Depends(session)]


def require(s: Session, capability: Capability) -> None:
    """403 naming the user and capability, exactly as the API refuses it."""
    if not s.who.can(capability):
        raise HTTPException(403, f"user {s.who.user!r} lacks the {capability.value!r} capability")


def same_origin(request: Request) -> None:
    """403 for a request that says it came from another origin or site."""
    site = request.headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        raise HTTPException(403, f"cross-site request refused (Sec-Fetch-Site: {site})")
    origin = request.headers.get("origin")
    if origin is None:
        return
    own = urlsplit(str(request.base_url))
    theirs = urlsplit(origin)
    if (theirs.scheme, theirs.netloc) != (own.scheme, own.netloc):
        raise HTTPException(403, f"cross-origin request refused (Origin: {origin[:200]})")


async def form(request: Request) -> dict[str, str]:
    """An ``application/x-www-form-urlencoded`` body (the console's forms), one value
    per field; 415 for another content type, 422 naming a repeated field."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind not in ("application/x-www-form-urlencoded", ""):
        raise HTTPException(415, f"content-type {kind!r}: the console posts form data")
    raw = (await request.body()).decode("utf-8", errors="replace")
    fields = parse_qs(raw, keep_blank_values=True, max_num_fields=64)
    repeated = sorted(k for k, v in fields.items() if len(v) != 1)
    if repeated:
        raise HTTPException(422, f"form field {repeated[0]!r} given more than once")
    return {k: v[0] for k, v in fields.items()}


def check_csrf(request: Request, s: Session, fields: dict[str, str]) -> None:
    """403 unless the request is same-origin and carries the session's CSRF token (form
    field ``csrf`` or header ``X-CSRF-Token``)."""
    same_origin(request)
    given = fields.get(CSRF_FIELD) or request.headers.get(CSRF_HEADER) or ""
    if not hmac.compare_digest(given.encode(), s.csrf.encode()):
        raise HTTPException(403, "missing or wrong CSRF token: reload the page and try again")


async def guarded_form(request: Request, s: Session) -> dict[str, str]:
    """The posted form, once the request passed the CSRF and origin checks."""
    fields = await form(request)
    check_csrf(request, s, fields)
    return fields
