"""The tokens file: a bad file is refused with a ConfigError naming file, entry and
field, and the error never shows a token."""

from __future__ import annotations

from pathlib import Path

import pytest

from airuntime.control_plane.rbac import Authenticator
from airuntime.core.errors import ConfigError

GOOD = "tokens:\n  - {token: dev-secret-1, user: alice, tenant: tenant-a, roles: [operator]}\n"


def test_a_valid_tokens_file_authenticates_its_tokens(tmp_path: Path) -> None:
    path = tmp_path / "tokens.yaml"
    path.write_text(GOOD)
    who = Authenticator.from_file(path).authenticate("dev-secret-1")
    assert who is not None and (who.user, who.tenant_id) == ("alice", "tenant-a")


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        pytest.param(None, ["cannot read tokens file: No such file"], id="missing"),
        pytest.param("tokens: [unclosed", ["not valid YAML"], id="bad-yaml"),
        pytest.param(
            GOOD.replace("operator", "wizard"),
            ["tokens.0: unknown role 'wizard'", "'token': '<redacted>'"],
            id="entry-error-redacts-the-token",
        ),
        pytest.param(
            GOOD.replace("dev-secret-1", "short"),
            ["tokens.0.token: String should have at least 8 characters", "'<redacted>'"],
            id="field-error-redacts-the-token",
        ),
        pytest.param(
            GOOD.replace("tenant-a", "Tenant A"),
            ["tokens.0.tenant: String should match pattern", "(value='Tenant A')"],
            id="field-error-shows-other-values",
        ),
    ],
)
def test_a_bad_tokens_file_names_file_entry_and_field_never_a_token(
    tmp_path: Path, text: str | None, needles: list[str]
) -> None:
    path = tmp_path / "tokens.yaml"
    if text is not None:
        path.write_text(text)
    with pytest.raises(ConfigError) as err:
        Authenticator.from_file(path)
    message = str(err.value)
    assert message.startswith(f"{path}: ")
    for needle in needles:
        assert needle in message
    assert "short" not in message and "dev-secret-1" not in message
