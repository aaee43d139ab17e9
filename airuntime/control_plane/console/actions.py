"""The console's state-changing requests (``POST /ui/...``): sign in and out, steer a
run, drain the queue.

Why this exists: the buttons of the console must do exactly what the API does for the
same token, and nothing a page of another origin could trigger. Each handler checks
origin and CSRF (:mod:`~airuntime.control_plane.console.session`), then the
capability the API route needs (403 naming it, as the API says it), then calls the
API's own route function (``runs.cancel``, ``run_steer.*``, ``queue.drain``) with the
signed-in principal, so refusals (404 for another tenant's run, 409 for a state that
does not allow it, 422 naming the field) are the API's. Success redirects back (303);
a refusal is an HTML page with the API's status and message.
"""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Final

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import RedirectResponse, Response
from pydantic import ValidationError

from airuntime.control_plane.api import queue, run_steer, runs
from airuntime.control_plane.api.deps import Context
from airuntime.control_plane.api.models import DrainRequest
from airuntime.control_plane.api.run_models import InputRequest
from airuntime.control_plane.api.runs import SharedRunId
from airuntime.control_plane.console.rendering import REFUSED, page, refused_page
from airuntime.control_plane.console.session import (
    COOKIE,
    PREFIX,
    Session,
    SignedIn,
    form,
    guarded_form,
    require,
    same_origin,
)
from airuntime.control_plane.rbac import Capability

router = APIRouter(prefix=PREFIX, include_in_schema=False)

SESSION_MAX_AGE_S: Final = 8 * 3600


class RunAction(StrEnum):
    CANCEL = "cancel"
    PAUSE = "pause"
    RESUME = "resume"
    REPLAY = "replay"
    INPUT = "input"


NEEDS: Final = {
    RunAction.CANCEL: Capability.CANCEL,
    RunAction.PAUSE: Capability.CANCEL,
    RunAction.RESUME: Capability.CANCEL,
    RunAction.REPLAY: Capability.SUBMIT,
    RunAction.INPUT: Capability.SUBMIT,
}


def _next(target: str) -> str:
    """Where to go after signing in: a console path only (no open redirect)."""
    if target.startswith(PREFIX + "/") and "//" not in target and "\\" not in target:
        return target
    return f"{PREFIX}/runs"


@router.get("/login")
async def login_page(request: Request, next: str = "") -> Response:
    return page(request, "login.html", None, next=_next(next[:512]), problem=None)


@router.post("/login")
async def login(request: Request, context: Context) -> Response:
    """Check the token with the API's authenticator and keep it in the session cookie."""
    same_origin(request)
    fields = await form(request)
    token, target = fields.get("token", "").strip(), _next(fields.get("next", "")[:512])
    if not token or context.auth.authenticate(token) is None:
        problem = "token: enter an API token" if not token else "token: unknown token"
        return page(request, "login.html", None, 401, next=target, problem=problem)
    answer = RedirectResponse(target, status_code=303)
    answer.set_cookie(
        COOKIE,
        token,
        max_age=SESSION_MAX_AGE_S,
        path=PREFIX,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return answer


@router.post("/logout")
async def logout(request: Request, s: SignedIn) -> Response:
    await guarded_form(request, s)
    answer = RedirectResponse(f"{PREFIX}/login", status_code=303)
    answer.delete_cookie(COOKIE, path=PREFIX, httponly=True, samesite="strict")
    return answer


async def _steer(action: RunAction, shared_run_id: str, s: Session, fields: dict[str, str]) -> str:
    """Do ``action``; the run page to go to afterwards."""
    who, ctx = s.who, s.context
    if action is RunAction.CANCEL:
        await runs.cancel(shared_run_id, who, ctx)
    elif action is RunAction.PAUSE:
        await run_steer.pause(shared_run_id, who, ctx)
    elif action is RunAction.RESUME:
        await run_steer.resume(shared_run_id, who, ctx)
    elif action is RunAction.REPLAY:
        replayed = await run_steer.replay(shared_run_id, who, ctx, Response())
        return replayed.shared_run_id
    else:
        await run_steer.provide_input(shared_run_id, _answer(fields), who, ctx)
    return shared_run_id


def _answer(fields: dict[str, str]) -> InputRequest:
    raw, kind = fields.get("value", ""), fields.get("as", "text")
    if kind not in ("text", "json"):
        raise HTTPException(422, f"as: {kind[:32]!r} is not one of text, json")
    value: object = raw
    if kind == "json":
        try:
            value = json.loads(raw)
        except ValueError as exc:
            raise HTTPException(422, f"value: not JSON ({exc})") from None
    try:
        return InputRequest(step=fields.get("step", ""), value=value)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise HTTPException(422, f"{'.'.join(map(str, first['loc']))}: {first['msg']}") from None


@router.post("/runs/{shared_run_id}/{action}")
async def steer(
    request: Request, shared_run_id: SharedRunId, action: RunAction, s: SignedIn
) -> Response:
    """Cancel, pause, resume, replay, or answer an input step, as the API would."""
    try:
        fields = await guarded_form(request, s)
        require(s, NEEDS[action])
        target = await _steer(action, shared_run_id, s, fields)
    except REFUSED as exc:
        return refused_page(request, s, exc)
    return RedirectResponse(f"{PREFIX}/runs/{target}?done={action.value}", status_code=303)


@router.post("/queue/drain")
async def drain(request: Request, s: SignedIn) -> Response:
    """Run the shared pump once over the queue (operators), as ``POST /v1/queue/drain``."""
    try:
        await guarded_form(request, s)
        require(s, Capability.DRAIN)
        result = await queue.drain(s.who, s.context, DrainRequest())
    except REFUSED as exc:
        return refused_page(request, s, exc)
    return RedirectResponse(
        f"{PREFIX}/queue?drained={result.dispatched}&failed={result.failed}", status_code=303
    )
