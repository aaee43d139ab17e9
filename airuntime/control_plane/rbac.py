"""Bearer tokens, roles and capabilities of the control-plane API.

A token maps to a user, a tenant and roles; roles grant capabilities (``submit``,
``read``, ``cancel``, ``drain``, ``admin``). The caller's tenant becomes the run's
ExecutionContextSnapshot, so a caller can never submit as, see, or cancel for
another tenant. Tokens are stored as SHA-256 digests when the file gives
``token_sha256``; plain ``token`` entries are for development.

Tokens file (YAML)::

    tokens:
      - token: dev-tenant-a          # or token_sha256: <hex>
        user: alice
        tenant: tenant-a
        tenant_group: null
        roles: [operator]
"""

from __future__ import annotations

import hashlib
import hmac
from enum import StrEnum
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

from airuntime.core.config_files import load_yaml_model
from airuntime.core.context import ExecutionContextSnapshot


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
    tenant: str = Field(pattern=r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
    tenant_group: str | None = None
    roles: list[str] = Field(min_length=1)

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


class Principal(BaseModel):
    model_config = ConfigDict(frozen=True)

    user: str
    tenant_id: str
    tenant_group_id: str | None = None
    capabilities: frozenset[Capability]

    def can(self, capability: Capability) -> bool:
        return capability in self.capabilities or Capability.ADMIN in self.capabilities

    def snapshot(self, project: str | None = None) -> ExecutionContextSnapshot:
        return ExecutionContextSnapshot(
            tenant_id=self.tenant_id,
            tenant_group_id=self.tenant_group_id,
            user_id=self.user,
            project=project,
        )


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
                )
        return None
