"""Who calls an MCP tool, and whether the caller's roles allow it.

Why this exists: MCP has no principal of its own. Over streamable HTTP the caller is
the API's bearer token (the same tokens file, the same :class:`Principal`), read from
the request that carried the tool call; over stdio the process was started for one
principal (a token resolved against the tokens file, or an explicit local admin), and
every call is that principal. Each tool declares a :class:`Capability`; a caller
without it gets a tool error naming the role that would grant it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError

from airuntime.control_plane.rbac import ROLES, Authenticator, Capability, Principal

ROLE_ORDER: Final = ("viewer", "submitter", "operator", "admin")
"""Roles from least to most capable: the one named in a denial is the first that grants."""


def role_for(capability: Capability) -> str:
    """The least role that grants ``capability``."""
    return next(r for r in ROLE_ORDER if capability in ROLES[r])


class Denied(ToolError):
    """The caller lacks the capability a tool needs, or is not authenticated."""


def bearer(headers: Any) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, if there is one."""
    value = headers.get("authorization") if headers is not None else None
    if not isinstance(value, str):
        return None
    scheme, _, token = value.partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


@dataclass(frozen=True)
class McpAccess:
    """Resolves the caller of a tool call: the request's bearer token when the call came
    over HTTP, else ``fixed`` (the principal a stdio process serves)."""

    auth: Authenticator | None = None
    fixed: Principal | None = None

    def caller(self, ctx: Context) -> Principal:
        request = ctx.request_context.request
        if request is None:
            if self.fixed is None:
                raise Denied("not authenticated: this server has no principal for stdio calls")
            return self.fixed
        token = bearer(getattr(request, "headers", None))
        who = self.auth.authenticate(token) if (token and self.auth) else None
        if who is None:
            raise Denied("not authenticated: missing or unknown bearer token")
        return who

    def require(self, ctx: Context, capability: Capability, tool: str) -> Principal:
        """The caller, if its roles grant ``capability``; else :class:`Denied` naming the role."""
        who = self.caller(ctx)
        if not who.can(capability):
            role = role_for(capability)
            raise Denied(
                f"permission denied: {tool} needs the {role!r} role (capability "
                f"{capability.value!r}); user {who.user!r} does not have it"
            )
        return who
