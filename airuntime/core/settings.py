"""How every airuntime process reads its configuration: ``AIRUNTIME_*`` variables.

Why this exists: the control plane, a runtime pod and the operator are configured by
the environment their pod template (or shell) gives them, and one setting must be
spelled one way everywhere. A process's settings model subclasses
:class:`EnvSettings` (pydantic-settings): a value passed to the constructor (an
explicit command-line option) wins over the environment, which wins over the field's
default, and every value is validated. :func:`env_name` is the one rule from a field to
its variable (``workers`` -> ``AIRUNTIME_WORKERS``), so code that must name a variable
-- the operator writing a pod's env, an error message -- derives it from the model
instead of spelling it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

from pydantic_settings import BaseSettings, SettingsConfigDict

from airuntime.core.errors import ConfigError

__all__ = [
    "ENV_PREFIX",
    "HOME_ENV",
    "REDIS_URL_ENV",
    "EnvSettings",
    "airuntime_home",
    "env_name",
    "prepared_home",
]

ENV_PREFIX: Final = "AIRUNTIME_"


def env_name(field: str) -> str:
    """The environment variable of a settings field: ``redis_url`` -> ``AIRUNTIME_REDIS_URL``."""
    return f"{ENV_PREFIX}{field.upper()}"


REDIS_URL_ENV: Final = env_name("redis_url")
"""The shared Redis/Valkey every process of one system uses (unset or empty: none given;
``airt run``/``up`` then start a private embedded Valkey)."""

HOME_ENV: Final = env_name("home")
"""The directory of a user's local state (``airt up``'s state file, runtime settings,
logs); unset or empty: ``~/.airuntime``."""


def airuntime_home() -> Path:
    """``$AIRUNTIME_HOME`` (``~`` expanded), else ``~/.airuntime``: the one rule every
    part that keeps local state (the stack's state file, runtime settings, logs, the
    default SQLite history) reads its directory by."""
    home = os.environ.get(HOME_ENV)
    return Path(home).expanduser() if home else Path.home() / ".airuntime"


def prepared_home() -> Path:
    """:func:`airuntime_home`, created when missing; a :class:`ConfigError` naming the
    variable and the path when it is not a directory this process can write (a file
    there, a parent that is a file, no permission), before anything is started in it."""
    home = airuntime_home()
    try:
        home.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        reason = "it is a file" if home.is_file() else (exc.strerror or str(exc))
        raise ConfigError(f"{HOME_ENV}={home}: cannot be used as a directory: {reason}") from None
    if not os.access(home, os.W_OK | os.X_OK):
        raise ConfigError(f"{HOME_ENV}={home}: this user cannot write in it")
    return home


class EnvSettings(BaseSettings):
    """Base of a process's settings: fields read from ``AIRUNTIME_<FIELD>``.

    An empty variable counts as unset (as it did for the command-line options that
    read them, and as the operator writes an empty ``AIRUNTIME_TENANT_GROUP_ID`` for a
    pool without a group). Settings are immutable once read.
    """

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_ignore_empty=True,
        extra="forbid",
        frozen=True,
        use_attribute_docstrings=True,
    )

    @classmethod
    def env_var(cls, field: str) -> str:
        """The variable of one of this model's fields; KeyError for a name it lacks."""
        if field not in cls.model_fields:
            raise KeyError(f"{cls.__name__} has no setting {field!r}")
        return env_name(field)
