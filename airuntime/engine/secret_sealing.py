"""Tenant secrets sealed at rest: AES-256-GCM under the platform's keys, bound to their tenant
and name.

Why this exists: a tenant's secret values (:mod:`airuntime.engine.tenant_secrets`) sit in
Redis, and Redis data travels further than the processes that use it: RDB/AOF files on a
volume, backups, replicas, a ``DUMP`` by whoever holds the Redis password. With
``AIRUNTIME_SECRETS_KEYS`` set (the control plane, which writes values, and every
runtime, which reads them, hold the same keys; the chart generates one and keeps it
across upgrades), a value is stored only sealed: what Redis holds is useless without a
key, and a sealed value copied to another tenant's or another name's record does not
open (the tenant id and the name are the cipher's associated data).

Keys: ``AIRUNTIME_SECRETS_KEYS`` is a comma-separated list of keys of at least 32
printable ASCII characters (no spaces or commas); each is stretched to a 256-bit AES key
with HKDF-SHA256. The first seals; every listed key opens, so a key is rotated by putting
the new one first, running ``airt secrets reseal`` (every stored value sealed again under
it), then dropping the old one. A sealed value names its key by a fingerprint (the first
8 bytes of SHA-256 of the derived key, in hex), never the key.

Without keys, values are stored as written (the earlier form) and a runtime reads them as
before; a value sealed under a key a runtime does not hold fails the step that names it,
naming the secret and the key's fingerprint, without sending anything.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import os
import re
from dataclasses import dataclass
from typing import Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from airuntime.core.errors import ConfigError

__all__ = [
    "SECRETS_KEYS_ENV",
    "SealedValue",
    "Sealer",
    "Unsealable",
    "configured_sealer",
    "parse_keys",
    "pin_sealer",
]

SECRETS_KEYS_ENV: Final = "AIRUNTIME_SECRETS_KEYS"
MIN_KEY_CHARS: Final = 32
_FORM: Final = "v1"
_KEY_TEXT = re.compile(r"^[\x21-\x7e]+$")
_HKDF_INFO: Final = b"airuntime tenant secrets v1"
_NONCE_BYTES: Final = 12


class Unsealable(Exception):
    """A sealed value this process cannot open (no key of its fingerprint, or tampered)."""


@dataclass(frozen=True, slots=True)
class SealedValue:
    """What is stored for a sealed value: ``v1:<key fingerprint>:<nonce+ciphertext b64>``."""

    text: str

    @property
    def fingerprint(self) -> str:
        parts = self.text.split(":", 2)
        return parts[1] if len(parts) == 3 else ""


def _derive(key: str) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_HKDF_INFO).derive(
        key.encode()
    )


def _fingerprint(derived: bytes) -> str:
    return hashlib.sha256(derived).hexdigest()[:16]


def parse_keys(text: str, *, variable: str = SECRETS_KEYS_ENV) -> tuple[str, ...]:
    """The keys of ``text`` (comma-separated), checked; raises :class:`ConfigError` naming
    ``variable`` and the key's position (never the key)."""
    keys = tuple(k.strip() for k in text.split(","))
    if keys == ("",):
        return ()
    for i, key in enumerate(keys, 1):
        if len(key) < MIN_KEY_CHARS:
            raise ConfigError(
                f"{variable}: key {i} has {len(key)} characters, fewer than {MIN_KEY_CHARS}"
            )
        if not _KEY_TEXT.match(key):
            raise ConfigError(
                f"{variable}: key {i} holds a character that is not printable ASCII "
                "(spaces and commas separate keys)"
            )
    if len(set(keys)) < len(keys):
        raise ConfigError(f"{variable}: a key is listed twice")
    return keys


class Sealer:
    """Seals with the first of its keys and opens with any of them."""

    def __init__(self, keys: tuple[str, ...]) -> None:
        if not keys:
            raise ValueError("a sealer needs at least one key")
        derived = [_derive(k) for k in keys]
        self._by_fingerprint = {_fingerprint(d): AESGCM(d) for d in derived}
        self.fingerprint = _fingerprint(derived[0])
        """The fingerprint of the key that seals."""
        self._sealing = self._by_fingerprint[self.fingerprint]

    @staticmethod
    def _bound(tenant_id: str, name: str) -> bytes:
        return f"{tenant_id}\x00{name}".encode()

    def seal(self, tenant_id: str, name: str, value: str) -> SealedValue:
        nonce = os.urandom(_NONCE_BYTES)
        sealed = self._sealing.encrypt(nonce, value.encode(), self._bound(tenant_id, name))
        text = base64.b64encode(nonce + sealed).decode()
        return SealedValue(f"{_FORM}:{self.fingerprint}:{text}")

    def open(self, tenant_id: str, name: str, sealed: SealedValue) -> str:
        form, fingerprint, text = [*sealed.text.split(":", 2), "", ""][:3]
        if form != _FORM:
            raise Unsealable(f"sealed in an unknown form {form[:8]!r}")
        cipher = self._by_fingerprint.get(fingerprint)
        if cipher is None:
            raise Unsealable(
                f"sealed under key {fingerprint[:16]!r}, which {SECRETS_KEYS_ENV} here does "
                "not hold (the control plane and every runtime must list the same keys)"
            )
        try:
            raw = base64.b64decode(text, validate=True)
            plain = cipher.decrypt(
                raw[:_NONCE_BYTES], raw[_NONCE_BYTES:], self._bound(tenant_id, name)
            )
        except (InvalidTag, ValueError):
            raise Unsealable(
                "does not open under its key: it was altered, or copied from another "
                "tenant's or another name's record"
            ) from None
        return plain.decode()


@functools.lru_cache(maxsize=4)
def _sealer_of(text: str) -> Sealer | None:
    keys = parse_keys(text)
    return Sealer(keys) if keys else None


_PINNED: list[Sealer | None] = []
"""The sealer :func:`pin_sealer` kept, if it ran in this process."""


def configured_sealer() -> Sealer | None:
    """The sealer of this process's ``AIRUNTIME_SECRETS_KEYS`` (None: unset, values are
    stored as written), or the one :func:`pin_sealer` kept. Raises :class:`ConfigError`
    naming the variable when malformed; the long-running commands ask at start, so a bad
    key stops them there."""
    if _PINNED:
        return _PINNED[0]
    return _sealer_of(os.environ.get(SECRETS_KEYS_ENV, ""))


def pin_sealer() -> Sealer | None:
    """Read the keys now and keep them for the process's life: a runtime removes
    credentials from its environment before any step runs
    (:mod:`runtime_pod.environment`; the variable's name marks it as one), and its
    pools read secrets after that."""
    sealer = _sealer_of(os.environ.get(SECRETS_KEYS_ENV, ""))
    _PINNED[:] = [sealer]
    return sealer
