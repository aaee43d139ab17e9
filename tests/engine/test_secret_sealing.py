"""Tenant secrets sealed at rest (:mod:`airuntime.engine.secret_sealing`): a sealed value
opens only for its tenant and name under a listed key, a tampered one never, keys rotate
without a value lost, and the stored records on a real server hold no value."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis

from airuntime.core import keys
from airuntime.core.errors import ConfigError
from airuntime.engine.secret_sealing import (
    SECRETS_KEYS_ENV,
    SealedValue,
    Sealer,
    Unsealable,
    configured_sealer,
    parse_keys,
)
from airuntime.engine.tenant_secrets import TenantSecrets, UnreadableSecret

OLD = "old-key-" + "o" * 40
NEW = "new-key-" + "n" * 40


def _value() -> str:
    return f"value-{os.urandom(8).hex()}"


@settings(max_examples=200, deadline=None)
@given(
    value=st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), min_size=4),
    tenant=st.from_regex(r"[a-z][a-z0-9-]{0,20}", fullmatch=True),
)
def test_a_value_opens_for_its_tenant_and_name_only(value: str, tenant: str) -> None:
    sealer = Sealer((NEW,))
    sealed = sealer.seal(tenant, "API_TOKEN", value)
    assert value not in sealed.text
    assert sealer.open(tenant, "API_TOKEN", sealed) == value
    for other_tenant, other_name in ((tenant + "x", "API_TOKEN"), (tenant, "API_TOKEN2")):
        with pytest.raises(Unsealable, match="copied from another"):
            sealer.open(other_tenant, other_name, sealed)


def test_sealing_twice_gives_two_texts() -> None:
    sealer = Sealer((NEW,))
    assert sealer.seal("t", "N", "same-value").text != sealer.seal("t", "N", "same-value").text


def test_a_tampered_value_never_opens() -> None:
    sealer = Sealer((NEW,))
    sealed = sealer.seal("t", "N", "the-value-1234")
    form, fingerprint, text = sealed.text.split(":", 2)
    raw = bytearray(base64.b64decode(text))
    for i in range(len(raw)):
        flipped = bytearray(raw)
        flipped[i] ^= 0x01
        bad = SealedValue(f"{form}:{fingerprint}:{base64.b64encode(bytes(flipped)).decode()}")
        with pytest.raises(Unsealable):
            sealer.open("t", "N", bad)
    with pytest.raises(Unsealable, match="unknown form"):
        sealer.open("t", "N", SealedValue("v9:" + sealed.text[3:]))


def test_keys_rotate_the_first_seals_every_one_opens() -> None:
    old_sealed = Sealer((OLD,)).seal("t", "N", "rotated-value")
    both = Sealer((NEW, OLD))
    assert both.open("t", "N", old_sealed) == "rotated-value"
    assert both.seal("t", "N", "v-1234").fingerprint == Sealer((NEW,)).fingerprint
    assert both.fingerprint != old_sealed.fingerprint
    with pytest.raises(Unsealable, match=f"{SECRETS_KEYS_ENV} here does not hold"):
        Sealer((NEW,)).open("t", "N", old_sealed)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("short-key", "key 1 has 9 characters, fewer than 32", id="short"),
        pytest.param(f"{NEW},tiny", "key 2 has 4 characters", id="second-short"),
        pytest.param(f"{NEW},{NEW}", "a key is listed twice", id="twice"),
        pytest.param("é" * 40, "not printable ASCII", id="not-ascii"),
        pytest.param(f"{NEW},", "key 2 has 0 characters", id="empty-entry"),
    ],
)
def test_malformed_keys_are_refused_naming_the_variable_never_the_key(
    text: str, message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        parse_keys(text)
    assert str(info.value).startswith(f"{SECRETS_KEYS_ENV}: ") and message in str(info.value)
    assert NEW not in str(info.value)


def test_no_keys_means_no_sealer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SECRETS_KEYS_ENV, raising=False)
    assert configured_sealer() is None
    monkeypatch.setenv(SECRETS_KEYS_ENV, f" {NEW} , {OLD} ")
    sealer = configured_sealer()
    assert sealer is not None and sealer.fingerprint == Sealer((NEW,)).fingerprint


async def test_stored_records_hold_no_value_and_list_their_key(redis: Redis) -> None:
    tenant, value = f"t-{os.urandom(3).hex()}", _value()
    sealed = TenantSecrets(redis, sealer=Sealer((NEW,)))
    info = await sealed.put(tenant, "API_TOKEN", value, "alice")
    raw = await redis.hget(keys.tenant_secrets(tenant), "API_TOKEN")
    assert raw is not None and value.encode() not in raw
    assert set(json.loads(raw)) == {"sealed", "updated_at_ms", "updated_by"}
    assert info.sealed_with == Sealer((NEW,)).fingerprint
    (listed,) = await sealed.listing(tenant)
    assert listed.sealed_with == info.sealed_with
    assert await sealed.values(tenant, {"API_TOKEN"}) == {"API_TOKEN": value}
    with pytest.raises(UnreadableSecret, match=f"sealed, and {SECRETS_KEYS_ENV} is not set"):
        await TenantSecrets(redis, sealer=None).values(tenant, {"API_TOKEN"})
    with pytest.raises(UnreadableSecret, match=r"API_TOKEN.*does not hold"):
        await TenantSecrets(redis, sealer=Sealer((OLD,))).values(tenant, {"API_TOKEN"})


async def test_reseal_moves_every_value_under_the_first_key(redis: Redis) -> None:
    """Values stored as written and values sealed under the old key are sealed under the
    new one and still read the same; one no key opens is named and left; one set while
    resealing (the record changed) is left as its setter wrote it."""
    tenants = [f"t-{os.urandom(3).hex()}" for _ in range(3)]
    plain, old, lost = _value(), _value(), _value()
    await TenantSecrets(redis, sealer=None).put(tenants[0], "PLAIN", plain, "a")
    await TenantSecrets(redis, sealer=Sealer((OLD,))).put(tenants[1], "OLD", old, "b")
    stranger = "stranger-key-" + "s" * 40
    await TenantSecrets(redis, sealer=Sealer((stranger,))).put(tenants[2], "LOST", lost, "c")
    rotated = TenantSecrets(redis, sealer=Sealer((NEW, OLD)))
    await rotated.put(tenants[2], "FRESH", _value(), "d")  # under the new key already

    report = await rotated.reseal()
    assert (report.sealed, report.current, report.changed) == (2, 1, 0)
    assert report.unreadable == [f"{tenants[2]}/LOST"]
    new_only = TenantSecrets(redis, sealer=Sealer((NEW,)))
    assert await new_only.values(tenants[0], {"PLAIN"}) == {"PLAIN": plain}
    assert await new_only.values(tenants[1], {"OLD"}) == {"OLD": old}
    for tenant, name, by in ((tenants[0], "PLAIN", "a"), (tenants[1], "OLD", "b")):
        (info,) = [i for i in await new_only.listing(tenant) if i.name == name]
        assert (info.sealed_with, info.updated_by) == (Sealer((NEW,)).fingerprint, by)
    assert (await rotated.reseal()).sealed == 0, "a second pass has nothing to do"

    key = keys.tenant_secrets(tenants[0])
    read = await redis.hget(key, "PLAIN")
    assert read is not None
    await new_only.put(tenants[0], "PLAIN", "set-meanwhile-1234", "e")
    replaced = await rotated.scripts.call(redis, "resealTenantSecret", [key], ["PLAIN", read, "x"])
    assert int(replaced) == 0
    assert await new_only.values(tenants[0], {"PLAIN"}) == {"PLAIN": "set-meanwhile-1234"}


def test_airt_up_keeps_one_key_in_its_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Made once, this user's only, the same on the next start (a stack on a persistent
    Redis opens what an earlier one sealed); a key in the environment wins."""
    from airuntime.devstack.local_stack import local_secrets_keys

    home = tmp_path
    monkeypatch.setenv("AIRUNTIME_HOME", str(home))
    monkeypatch.delenv(SECRETS_KEYS_ENV, raising=False)
    local_secrets_keys()
    first = os.environ[SECRETS_KEYS_ENV]
    assert parse_keys(first) == (first,)
    path = home / "secrets.keys"
    assert path.stat().st_mode & 0o777 == 0o600
    monkeypatch.delenv(SECRETS_KEYS_ENV)
    local_secrets_keys()
    assert os.environ[SECRETS_KEYS_ENV] == first
    monkeypatch.setenv(SECRETS_KEYS_ENV, NEW)
    local_secrets_keys()
    assert os.environ[SECRETS_KEYS_ENV] == NEW


def test_a_pinned_sealer_outlives_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a runtime does before scrubbing its credentials from its environment."""
    from airuntime.engine import secret_sealing

    monkeypatch.setattr(secret_sealing, "_PINNED", [])
    monkeypatch.setenv(SECRETS_KEYS_ENV, NEW)
    pinned = secret_sealing.pin_sealer()
    monkeypatch.delenv(SECRETS_KEYS_ENV)
    assert configured_sealer() is pinned and pinned is not None
