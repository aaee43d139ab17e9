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

from typing import Final

from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["ENV_PREFIX", "HOME_ENV", "REDIS_URL_ENV", "EnvSettings", "env_name"]

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
