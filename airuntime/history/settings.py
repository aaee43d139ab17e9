"""How a process is told where its durable history lives: ``AIRUNTIME_HISTORY_*``.

Why this exists: the control plane, the runtime instances and ``airt history migrate``
must open the same store from the same variables. With nothing set the store is a
SQLite file under ``AIRUNTIME_HOME`` (``~/.airuntime/history.db``), so ``airt up`` and
``airt demo`` keep history with nothing to set up; production sets a PostgreSQL DSN
(the chart from a Secret).
"""

from __future__ import annotations

from pydantic import Field, model_validator

from airuntime.core.settings import EnvSettings, airuntime_home

__all__ = ["DEFAULT_PAYLOAD_THRESHOLD_BYTES", "HistorySettings", "default_dsn"]

DEFAULT_PAYLOAD_THRESHOLD_BYTES = 64 * 1024


def default_dsn() -> str:
    """``sqlite:///$AIRUNTIME_HOME/history.db`` (home defaults to ``~/.airuntime``)."""
    return f"sqlite:///{airuntime_home().absolute() / 'history.db'}"


class HistorySettings(EnvSettings):
    """The durable history's settings (options over ``AIRUNTIME_*`` over defaults)."""

    history_dsn: str | None = None
    """Where the durable history lives: ``sqlite:///<path>`` or ``postgresql://...``.
    Default: sqlite:///$AIRUNTIME_HOME/history.db."""
    payload_threshold_bytes: int = Field(default=DEFAULT_PAYLOAD_THRESHOLD_BYTES, ge=0)
    """Step outputs larger than this many bytes go to the durable payload store and
    Redis keeps a reference (default 65536)."""
    history_pool_min_size: int = Field(default=1, ge=0, le=100)
    """PostgreSQL: connections the pool keeps open (default 1)."""
    history_pool_max_size: int = Field(default=10, ge=1, le=1000)
    """PostgreSQL: most connections the pool opens (default 10)."""
    history_timeout_s: float = Field(default=10.0, gt=0, le=600)
    """How long an operation waits for a connection (or a SQLite lock) before the store
    counts as unavailable (default 10 seconds)."""
    history_auto_migrate: bool = False
    """PostgreSQL: apply pending schema migrations when the store is opened (default
    false: run airt history migrate). SQLite files are always migrated on open."""

    @model_validator(mode="after")
    def _pool_sizes(self) -> HistorySettings:
        if self.history_pool_min_size > self.history_pool_max_size:
            raise ValueError(
                f"history_pool_min_size {self.history_pool_min_size} is more than "
                f"history_pool_max_size {self.history_pool_max_size}"
            )
        return self

    def dsn(self) -> str:
        """The DSN in force: the setting, or the default SQLite file."""
        return self.history_dsn or default_dsn()
