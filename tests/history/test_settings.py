"""The history's settings and DSNs: ``AIRUNTIME_HISTORY_*`` names and defaults, the
default SQLite file under ``AIRUNTIME_HOME``, DSN parsing with passwords masked, and
the small pure pieces (payload addresses and references, cursors)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from airuntime.core.errors import ConfigError
from airuntime.history import ArchivedEvent, ArchivedSharedRun, HistorySettings, Payload, PayloadRef
from airuntime.history.dsn import Backend, parse_dsn, redact
from airuntime.history.errors import InvalidCursor
from airuntime.history.listing import Position, SharedRunFilter, decode_cursor, encode_cursor
from airuntime.history.records import payload_id


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    import os

    for name in list(os.environ):
        if name.startswith("AIRUNTIME_"):
            monkeypatch.delenv(name)
    return monkeypatch


def test_defaults_and_variable_names(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    clean_env.setenv("AIRUNTIME_HOME", str(tmp_path))
    defaults = HistorySettings()
    assert defaults.dsn() == f"sqlite:///{tmp_path / 'history.db'}"
    assert parse_dsn(defaults.dsn()).sqlite_path == tmp_path / "history.db"
    assert defaults.payload_threshold_bytes == 65536
    assert (defaults.history_pool_min_size, defaults.history_pool_max_size) == (1, 10)
    assert defaults.history_auto_migrate is False
    assert {HistorySettings.env_var(f) for f in HistorySettings.model_fields} == {
        "AIRUNTIME_HISTORY_DSN",
        "AIRUNTIME_PAYLOAD_THRESHOLD_BYTES",
        "AIRUNTIME_HISTORY_POOL_MIN_SIZE",
        "AIRUNTIME_HISTORY_POOL_MAX_SIZE",
        "AIRUNTIME_HISTORY_TIMEOUT_S",
        "AIRUNTIME_HISTORY_AUTO_MIGRATE",
    }

    clean_env.setenv("AIRUNTIME_HISTORY_DSN", "postgresql://airt@db:5432/airt")
    clean_env.setenv("AIRUNTIME_PAYLOAD_THRESHOLD_BYTES", "1024")
    clean_env.setenv("AIRUNTIME_HISTORY_AUTO_MIGRATE", "true")
    from_env = HistorySettings()
    assert from_env.dsn() == "postgresql://airt@db:5432/airt"
    assert from_env.payload_threshold_bytes == 1024 and from_env.history_auto_migrate


def test_the_home_default_is_used_without_a_home_variable(clean_env: pytest.MonkeyPatch) -> None:
    assert HistorySettings().dsn() == f"sqlite:///{Path.home() / '.airuntime' / 'history.db'}"


def test_invalid_settings_are_refused(clean_env: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValidationError, match="more than history_pool_max_size"):
        HistorySettings(history_pool_min_size=5, history_pool_max_size=2)
    with pytest.raises(ValidationError):
        HistorySettings(payload_threshold_bytes=-1)


@pytest.mark.parametrize(
    ("dsn", "backend"),
    [
        ("sqlite:///relative/history.db", Backend.SQLITE),
        ("sqlite:////abs/history.db", Backend.SQLITE),
        ("postgresql://u:pw@h:5432/db", Backend.POSTGRESQL),
        ("postgres://u@/db?host=/run/pg", Backend.POSTGRESQL),
    ],
)
def test_dsns_name_their_backend(dsn: str, backend: Backend) -> None:
    parsed = parse_dsn(dsn)
    assert parsed.backend is backend
    if backend is Backend.SQLITE:
        assert parsed.sqlalchemy_url == dsn
    else:
        assert parsed.sqlalchemy_url.startswith("postgresql+psycopg://")


@pytest.mark.parametrize(
    "dsn", ["", "sqlite:///", "sqlite:///:memory:", "sqlite:///x.db?mode=ro", "mysql://u:pw@h/db"]
)
def test_other_dsns_are_refused_with_the_password_masked(dsn: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_dsn(dsn)
    assert "pw" not in str(info.value)


def test_passwords_are_masked() -> None:
    assert redact("postgresql://u:s3cret@h/db") == "postgresql://u:***@h/db"
    assert redact("postgresql://h/db?password=s3cret&x=1") == "postgresql://h/db?password=***&x=1"
    assert str(parse_dsn("postgresql://u:s3cret@h/db")) == "postgresql://u:***@h/db"


def test_a_payload_address_names_its_owner_and_content() -> None:
    base = payload_id("t", "e", "s", b"data")
    assert base == payload_id("t", "e", "s", b"data")
    assert len({base, payload_id("u", "e", "s", b"data"), payload_id("t", "e", "s", b"date")}) == 3
    # The framing keeps ("ab", "c") and ("a", "bc") apart.
    assert payload_id("ab", "c", "s", b"") != payload_id("a", "bc", "s", b"")
    payload = Payload.of("t", "e", "s", b"data")
    assert payload.problem() is None and payload.size == 4
    ref = payload.ref().to_json()
    assert ref == {"$payload": payload.payload_id, "size": 4, "sha256": payload.sha256}
    assert PayloadRef.from_json(ref) == payload.ref()
    for other in ({"$payload": 1}, {"value": 1}, "text", None, {"$payload": "p", "size": "4"}):
        assert PayloadRef.from_json(other) is None


def test_a_cursor_round_trips_only_with_its_filter() -> None:
    query = SharedRunFilter("t", ("Failed", "Succeeded"), "p", 1, 2)
    cursor = encode_cursor(Position(5, "sr-1"), query)
    assert decode_cursor(cursor, SharedRunFilter("t", ("Succeeded", "Failed"), "p", 1, 2)) == (
        Position(5, "sr-1")
    )
    with pytest.raises(InvalidCursor):
        decode_cursor(cursor, SharedRunFilter(None))


def test_records_refuse_what_could_not_be_read_back() -> None:
    from tests.history import records

    with pytest.raises(ValueError, match="plan is a list, not a JSON object"):
        records.execution(plan=[1, 2])
    with pytest.raises(ValueError, match="tenant_id is empty"):
        records.execution(tenant_id="")
    with pytest.raises(ValueError, match="created_ms"):
        records.execution(created_ms=-1)
    with pytest.raises(ValueError, match="fields are not strings to strings"):
        ArchivedEvent("e-1", 0, "1-0", "claim", {"attempt": 1})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="run is a str"):
        ArchivedSharedRun("sr-1", "t", "p", "Succeeded", 1, None, "{}")  # type: ignore[arg-type]
