"""A tenant's model token budget: how many tokens its ``model`` steps may spend in an hour, a
day or a month.

Why this exists: ``model`` steps are paid by the platform (its providers, its keys), and
tenants are untrusted: one tenant's pipeline in a loop, or a fan-out of 20,000 model
steps, would otherwise spend what the platform pays for without a bound. The platform sets
``model_token_budget`` in a tenant's settings (``{"tokens": N, "window": "day"}``; the
RuntimePool's ``modelTokenBudget`` on Kubernetes); with none, the tenant's model calls are
not limited here (the providers' own limits and ``throttle`` rules still apply).

How it is kept: before a call, the step reserves the most tokens its reply may use (its
``max_tokens``, which the provider enforces); the call is refused, failing the step with
no retry and naming the budget, when the tokens used and reserved in the window plus that
would pass the budget. After the call the reservation is settled with the tokens the
provider reported (prompt and reply); a call that failed uses none. All of it is one Lua
script (``modelTokens-2.lua``) over one small hash a tenant
(:func:`airuntime.core.keys.tenant_model_tokens`) that reads the budget from the tenant's
stored settings in the same call, so every runtime of the tenant, on any node, draws from
one count, and a changed budget applies to the next call. Windows are calendar hours,
days and months in UTC by the Redis server's clock.

What it bounds, exactly: a call starts only while the budget has room for its longest
reply, so replies never pass the budget; its prompt is counted when the call ends (a
prompt's tokens are known only to the provider), so the last calls of a window may pass
the budget by their prompts. A reservation whose runtime died during the call stays
counted until the window ends.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field
from redis.exceptions import RedisError

from airuntime.core import keys
from airuntime.core.redis_client import RedisClient
from airuntime.core.scripts import ScriptLibrary, library
from airuntime.engine.handlers import StepFailed, TransientError

__all__ = [
    "MAX_BUDGET_TOKENS",
    "BudgetSpent",
    "BudgetWindow",
    "ModelBudgets",
    "ModelTokenBudget",
    "TokenReservation",
    "TokenUsage",
]

log = logging.getLogger(__name__)

MAX_BUDGET_TOKENS: Final = 10**12
_SCRIPT: Final = "modelTokens"


class BudgetWindow(StrEnum):
    """The calendar period (UTC) a budget renews every."""

    HOUR = "hour"
    DAY = "day"
    MONTH = "month"


class ModelTokenBudget(BaseModel):
    """A tenant's ``model_token_budget`` setting."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tokens: int = Field(ge=1, le=MAX_BUDGET_TOKENS)
    """Tokens (prompt and reply, every provider) the tenant's model steps may use in one window."""
    window: BudgetWindow = BudgetWindow.DAY
    """The calendar hour, day or month (UTC) the budget is for; it renews at the next."""


@dataclass(frozen=True, slots=True)
class TokenUsage:
    """Where a tenant stands in its budget's current window."""

    budget: int
    window: BudgetWindow
    started_at_ms: int
    resets_at_ms: int
    used: int
    """Tokens the calls that ended in this window reported."""
    reserved: int
    """Tokens held by calls still going on (their longest replies)."""

    @property
    def remaining(self) -> int:
        return max(0, self.budget - self.used - self.reserved)


@dataclass(frozen=True, slots=True)
class TokenReservation:
    """Tokens one call holds until it settles."""

    tenant_id: str
    window_id: str
    tokens: int


class BudgetSpent(StepFailed):
    """The tenant's budget has no room for the call's longest reply in this window."""


def _usage(reply: list[Any]) -> TokenUsage:
    _, _, start, end, used, reserved, limit, kind = reply
    return TokenUsage(
        budget=int(limit),
        window=BudgetWindow(kind.decode() if isinstance(kind, bytes) else str(kind)),
        started_at_ms=int(start) * 1000,
        resets_at_ms=int(end) * 1000,
        used=int(used),
        reserved=int(reserved),
    )


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class ModelBudgets:
    """The model token budgets of every tenant on one Redis (each call names the tenant)."""

    def __init__(self, redis: RedisClient, scripts: ScriptLibrary | None = None) -> None:
        self.redis = redis
        self.scripts = scripts or library()

    async def _call(self, tenant_id: str, *args: Any) -> Any:
        return await self.scripts.call(
            self.redis,
            _SCRIPT,
            [keys.tenant_settings(tenant_id), keys.tenant_model_tokens(tenant_id)],
            list(args),
        )

    async def usage(self, tenant_id: str, *, at_s: int | None = None) -> TokenUsage | None:
        """The tenant's current window (None: it has no budget). ``at_s``: judge the
        window at that time instead of the server's (tests of the calendar)."""
        reply = await self._call(tenant_id, "read", 0, 0, "", "" if at_s is None else at_s)
        return None if int(reply[0]) == 0 else _usage(reply)

    async def reserve(
        self, tenant_id: str, tokens: int, *, at_s: int | None = None
    ) -> TokenReservation | None:
        """Hold ``tokens`` of the tenant's budget for one call (None: the tenant has no
        budget, nothing is held). Raises :class:`BudgetSpent` naming the budget when it
        has no room, and :class:`TransientError` when the budget cannot be read (the
        step's retry policy decides: the call is not made unbudgeted)."""
        try:
            reply = await self._call(
                tenant_id, "reserve", tokens, 0, "", "" if at_s is None else at_s
            )
        except (RedisError, OSError) as exc:
            raise TransientError(
                f"tenant {tenant_id!r}: the model token budget could not be read: {exc}"
            ) from exc
        code = int(reply[0])
        if code == 0:
            return None
        if code < 0:
            usage = _usage(reply)
            raise BudgetSpent(
                f"tenant {tenant_id!r} has used {usage.used:,} of its {usage.budget:,} model "
                f"tokens this {usage.window.value} (UTC; {usage.reserved:,} more held by calls "
                f"going on), and this call may use up to {tokens:,}: the budget "
                f"(model_token_budget) renews at {_iso(usage.resets_at_ms)}"
            )
        return TokenReservation(tenant_id, _text(reply[1]), tokens)

    async def settle(self, reservation: TokenReservation, used: int) -> None:
        """Count ``used`` tokens of the call and free what it held. Never raises: a
        settle that cannot be written leaves the reservation counted until the window
        ends (logged), and the step's result stands."""
        r = reservation
        try:
            await self._call(r.tenant_id, "settle", r.tokens, max(0, used), r.window_id, "")
        except (RedisError, OSError) as exc:
            log.warning(
                "tenant %r: a model call's %d reserved tokens stay counted until the window "
                "ends: the settle failed: %s",
                reservation.tenant_id,
                reservation.tokens,
                exc,
            )


def _iso(ms: int) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%MZ")
