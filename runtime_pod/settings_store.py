"""Persisted settings of one runtime instance.

Why this exists: some runtime behaviour is an operator decision for a particular instance
(for example ``max_concurrent_step_tasks``, the bound enforced by
:class:`runtime_pod.step_slots.StepSlotController`), must survive restarts, and must be
changeable on a running instance without restarting it.  :class:`SettingsStore` keeps those
settings in a small YAML file::

    max_concurrent_step_tasks: 4

at :func:`default_settings_path` (``$AIRUNTIME_HOME/runtime/settings.yaml``, with
``AIRUNTIME_HOME`` defaulting to ``~/.airuntime``).

* :meth:`SettingsStore.load` reads the file (missing file or empty file -> defaults).  A
  manually edited invalid file raises :class:`SettingsFileError` naming the file, the key
  and the value; edits to the file take effect when settings are (re)loaded.
* :meth:`SettingsStore.set` validates one update (CLI strings such as ``"4"`` are parsed),
  writes the file atomically (temp file + fsync + ``os.replace``) and then notifies
  subscribers, e.g. a live slot controller::

      store.subscribe(lambda s: controller.set_limit(s.max_concurrent_step_tasks))

  A rejected update changes neither the file nor the live value.

Adding a setting: add a field with a default to :class:`RuntimeSettings`; parsing of CLI
strings, diagnostics, persistence and subscriber notification pick it up automatically.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from airuntime.core.settings import airuntime_home

__all__ = [
    "RuntimeSettings",
    "SettingsError",
    "SettingsFileError",
    "SettingsStore",
    "SettingsSubscriber",
    "default_settings_path",
]

_INT_TEXT = re.compile(r"[+-]?[0-9]+")


class RuntimeSettings(BaseModel):
    """Settings of one runtime instance (immutable; use ``model_copy``/``SettingsStore``)."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    max_concurrent_step_tasks: int = Field(
        default=0,
        ge=0,
        description=(
            "Maximum number of step handlers executing concurrently on this instance, "
            "across all executions; 0 means unrestricted."
        ),
    )

    @classmethod
    def known_keys(cls) -> tuple[str, ...]:
        return tuple(cls.model_fields)


SettingsSubscriber = Callable[[RuntimeSettings], None]


class SettingsError(ValueError):
    """An invalid setting key or value (nothing was changed)."""


class SettingsFileError(SettingsError):
    """The settings file could not be read or holds invalid content."""

    def __init__(self, path: Path, detail: str) -> None:
        super().__init__(f"{path}: {detail}")
        self.path = path
        self.detail = detail


def default_settings_path() -> Path:
    """``$AIRUNTIME_HOME/runtime/settings.yaml`` (``AIRUNTIME_HOME`` defaults to ~/.airuntime)."""
    return airuntime_home() / "runtime" / "settings.yaml"


def _requirement(key: str) -> str | None:
    """Human wording of a field's constraint, e.g. ``must be an integer >= 0``."""
    field = RuntimeSettings.model_fields[key]
    if field.annotation is int:
        bounds = [f">= {m.ge}" for m in field.metadata if getattr(m, "ge", None) is not None]
        bounds += [f"<= {m.le}" for m in field.metadata if getattr(m, "le", None) is not None]
        return " ".join(["must be an integer", *bounds])
    return None


def _unknown_key(key: object) -> str:
    known = ", ".join(RuntimeSettings.known_keys())
    return f"unknown setting {key!r} (known settings: {known})"


def _describe(error: ValidationError, values: Mapping[str, object]) -> str:
    """One line per problem, naming the key and the offending value."""
    problems: list[str] = []
    for item in error.errors():
        key = item["loc"][0] if item["loc"] else None
        if item["type"] == "extra_forbidden":
            problems.append(_unknown_key(key))
            continue
        if not isinstance(key, str) or key not in RuntimeSettings.model_fields:
            problems.append(item["msg"])
            continue
        requirement = _requirement(key) or item["msg"]
        problems.append(f"{key}: {requirement}, got {values.get(key, item['input'])!r}")
    return "; ".join(problems)


def _parse_cli(key: str, raw: object) -> object:
    """Convert a CLI string to the field's type where unambiguous; validation decides."""
    if isinstance(raw, str) and RuntimeSettings.model_fields[key].annotation is int:
        text = raw.strip()
        if _INT_TEXT.fullmatch(text):
            return int(text)
    return raw


class SettingsStore:
    """Loads, validates, atomically persists and publishes :class:`RuntimeSettings`."""

    def __init__(self, path: Path | None = None) -> None:
        self._path = path if path is not None else default_settings_path()
        self._current: RuntimeSettings | None = None
        self._subscribers: list[SettingsSubscriber] = []

    @property
    def path(self) -> Path:
        return self._path

    @property
    def current(self) -> RuntimeSettings:
        """The live settings (read from the file on first access, without notifying)."""
        if self._current is None:
            self._current = self._read()
        return self._current

    def load(self) -> RuntimeSettings:
        """Read the file, make it the live value and notify subscribers.

        A missing or empty file yields defaults.  Invalid content raises
        :class:`SettingsFileError` and keeps the previous live value.
        """
        settings = self._read()
        self._current = settings
        self._notify(settings)
        return settings

    def save(self, settings: RuntimeSettings) -> None:
        """Atomically write ``settings`` to the file (it is never left half-written).

        This only persists; use :meth:`set` to also update the live value.
        """
        text = "# airuntime runtime instance settings\n" + yaml.safe_dump(
            settings.model_dump(mode="json"), sort_keys=True, default_flow_style=False
        )
        _atomic_write(self._path, text.encode("utf-8"))

    def set(self, key: str, raw_value: str | int) -> RuntimeSettings:
        """Validate, persist and publish one setting; return the new live settings.

        ``raw_value`` may be a CLI string (``"4"``).  Unknown keys and invalid values raise
        :class:`SettingsError` naming the key and value; the file and the live value are
        then unchanged.  Subscribers are notified after the file has been written.
        """
        if key not in RuntimeSettings.model_fields:
            raise SettingsError(_unknown_key(key))
        value = _parse_cli(key, raw_value)
        data: dict[str, object] = {**self.current.model_dump(), key: value}
        try:
            updated = RuntimeSettings.model_validate(data)
        except ValidationError as exc:
            raise SettingsError(_describe(exc, {key: raw_value})) from None
        self.save(updated)
        self._current = updated
        self._notify(updated)
        return updated

    def subscribe(self, callback: SettingsSubscriber) -> Callable[[], None]:
        """Call ``callback(settings)`` after every successful ``load()``/``set()``.

        Returns a function that removes the subscription.
        """
        self._subscribers.append(callback)

        def unsubscribe() -> None:
            with contextlib.suppress(ValueError):
                self._subscribers.remove(callback)

        return unsubscribe

    def _notify(self, settings: RuntimeSettings) -> None:
        # Every subscriber is called; the first failure is re-raised afterwards.
        first: Exception | None = None
        for callback in list(self._subscribers):
            try:
                callback(settings)
            except Exception as exc:
                first = first or exc
        if first is not None:
            raise first

    def _read(self) -> RuntimeSettings:
        try:
            text = self._path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return RuntimeSettings()
        except OSError as exc:
            raise SettingsFileError(self._path, f"cannot read settings: {exc}") from exc
        try:
            data: Any = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise SettingsFileError(self._path, f"invalid YAML: {exc}") from None
        if data is None:
            return RuntimeSettings()
        if not isinstance(data, dict):
            raise SettingsFileError(
                self._path,
                f"expected a mapping of setting: value, got {type(data).__name__}",
            )
        try:
            return RuntimeSettings.model_validate(data)
        except ValidationError as exc:
            raise SettingsFileError(self._path, _describe(exc, data)) from None


def _atomic_write(path: Path, data: bytes) -> None:
    """Write via a temp file in the same directory, fsync it, then ``os.replace``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        mode = 0o644
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_directory(path.parent)


def _fsync_directory(directory: Path) -> None:
    """Make the rename durable; best effort (not every platform/filesystem supports it)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
