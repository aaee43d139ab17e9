"""Bearer tokens, roles and capabilities of the control-plane API.

A token maps to a user, a tenant and roles; roles grant capabilities (``submit``,
``read``, ``cancel``, ``drain``, ``admin``). The caller's tenant becomes the run's
ExecutionContextSnapshot, so a caller can never submit as, see, or cancel for
another tenant. Tokens are stored as SHA-256 digests when the file gives
``token_sha256``; plain ``token`` entries are for development.

A submission may set more of its snapshot, only within what its token allows
(:meth:`Principal.snapshot`; anything else is refused naming the field and the value,
403): ``project`` one of the token's ``projects``, ``current_namespace`` and every
entry of ``namespaces`` among the token's ``namespaces`` (``"*"`` in either list:
any), ``context_key`` only when the token has ``context_key: true``, and
``tenant_group_id`` only the token's own group. The tenant always comes from the token.

Tokens file (YAML)::

    tokens:
      - token: dev-tenant-a          # or token_sha256: <hex>
        user: alice
        tenant: tenant-a
        tenant_group: null
        roles: [operator]
        projects: [reports]          # optional; default none
        namespaces: [team-a, shared] # optional; default none
        context_key: false           # optional; default false
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Collection
from enum import StrEnum
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

from airuntime.core.config_files import load_yaml_model
from airuntime.core.context import ExecutionContextSnapshot
from airuntime.core.errors import AirError

ANY: str = "*"
"""In a token's ``projects`` or ``namespaces``: every value is allowed."""


def _pattern(model: type[BaseModel], field: str) -> str:
    for meta in model.model_fields[field].metadata:
        pattern = getattr(meta, "pattern", None)
        if isinstance(pattern, str):
            return pattern
    raise LookupError(f"{model.__name__}.{field} has no pattern")


TENANT_ID_PATTERN: str = _pattern(ExecutionContextSnapshot, "tenant_id")
"""What a tenant id looks like: the snapshot's own rule (a DNS label)."""


class Capability(StrEnum):
    SUBMIT = "submit"
    READ = "read"
    CANCEL = "cancel"
    DRAIN = "drain"
    ADMIN = "admin"


ROLES: dict[str, frozenset[Capability]] = {
    "viewer": frozenset({Capability.READ}),
    "submitter": frozenset({Capability.SUBMIT, Capability.READ}),
    "operator": frozenset(
        {Capability.SUBMIT, Capability.READ, Capability.CANCEL, Capability.DRAIN}
    ),
    "admin": frozenset(Capability),
}


class TokenEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    token: str | None = Field(default=None, min_length=8)
    token_sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    user: str = Field(min_length=1)
    tenant: str = Field(pattern=TENANT_ID_PATTERN)
    tenant_group: str | None = None
    roles: list[str] = Field(min_length=1)
    projects: list[str] = Field(default_factory=list)
    """Projects a submission may name (``"*"``: any); default none."""
    namespaces: list[str] = Field(default_factory=list)
    """Namespaces a submission may act in or name (``"*"``: any); default none."""
    context_key: bool = False
    """Whether a submission may set its context key; default false."""

    @model_validator(mode="after")
    def _one_secret_known_roles(self) -> TokenEntry:
        if (self.token is None) == (self.token_sha256 is None):
            raise ValueError("give exactly one of token or token_sha256")
        unknown = [r for r in self.roles if r not in ROLES]
        if unknown:
            raise ValueError(f"unknown role {unknown[0]!r} (known: {', '.join(sorted(ROLES))})")
        return self

    @property
    def digest(self) -> str:
        return self.token_sha256 or hashlib.sha256((self.token or "").encode()).hexdigest()


SECRETS = frozenset({"token", "token_sha256"})


class TokensFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tokens: list[TokenEntry]


class NotAllowed(AirError):
    """A submission asked for a snapshot field its token does not allow (403)."""

    def __init__(self, field: str, value: object, allowed: Collection[str] | None) -> None:
        within = (
            f" (allowed: {', '.join(sorted(allowed)) or 'none'})" if allowed is not None else ""
        )
        super().__init__(f"{field} {value!r} is not allowed for this token{within}")
        self.field = field


class Principal(BaseModel):
    model_config = ConfigDict(frozen=True)

    user: str
    tenant_id: str
    tenant_group_id: str | None = None
    capabilities: frozenset[Capability]
    projects: frozenset[str] = frozenset()
    namespaces: frozenset[str] = frozenset()
    context_key: bool = False

    def can(self, capability: Capability) -> bool:
        return capability in self.capabilities or Capability.ADMIN in self.capabilities

    def snapshot(
        self,
        project: str | None = None,
        *,
        current_namespace: str | None = None,
        namespaces: Collection[str] = (),
        context_key: str | None = None,
        tenant_group_id: str | None = None,
    ) -> ExecutionContextSnapshot:
        """The snapshot of a run this caller submits; :class:`NotAllowed` for a field
        value the token does not allow. The tenant is always the token's."""
        if project is not None and not _within(project, self.projects):
            raise NotAllowed("project", project, self.projects)
        if current_namespace is not None and not _within(current_namespace, self.namespaces):
            raise NotAllowed("current_namespace", current_namespace, self.namespaces)
        for ns in namespaces:
            if not _within(ns, self.namespaces):
                raise NotAllowed("namespaces", ns, self.namespaces)
        if context_key is not None and not self.context_key:
            raise NotAllowed("context_key", context_key, None)
        if tenant_group_id is not None and tenant_group_id != self.tenant_group_id:
            own = [self.tenant_group_id] if self.tenant_group_id else []
            raise NotAllowed("tenant_group_id", tenant_group_id, own)
        return ExecutionContextSnapshot(
            tenant_id=self.tenant_id,
            tenant_group_id=self.tenant_group_id,
            user_id=self.user,
            project=project,
            context_key=context_key,
            current_namespace=current_namespace,
            namespaces=tuple(namespaces),
        )


def _within(value: str, allowed: frozenset[str]) -> bool:
    return ANY in allowed or value in allowed


class Authenticator:
    def __init__(self, entries: list[TokenEntry]) -> None:
        self._by_digest = {e.digest: e for e in entries}

    @classmethod
    def from_file(cls, path: Path) -> Authenticator:
        """The tokens file; errors name the entry and field, never a token."""
        tokens = load_yaml_model(path, TokensFile, what="tokens file", secret_fields=SECRETS)
        return cls(tokens.tokens)

    def authenticate(self, token: str) -> Principal | None:
        digest = hashlib.sha256(token.encode()).hexdigest()
        for known, entry in self._by_digest.items():
            if hmac.compare_digest(known, digest):
                caps: set[Capability] = set()
                for role in entry.roles:
                    caps |= ROLES[role]
                return Principal(
                    user=entry.user,
                    tenant_id=entry.tenant,
                    tenant_group_id=entry.tenant_group,
                    capabilities=frozenset(caps),
                    projects=frozenset(entry.projects),
                    namespaces=frozenset(entry.namespaces),
                    context_key=entry.context_key,
                )
        return None
