"""Persisted runtime instance settings and their live application to the slot controller."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from runtime_pod.settings_store import (
    RuntimeSettings,
    SettingsError,
    SettingsFileError,
    SettingsStore,
    default_settings_path,
)
from runtime_pod.step_slots import StepSlotController

KEY = "max_concurrent_step_tasks"


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "home" / "runtime" / "settings.yaml"


def bind(store: SettingsStore, controller: StepSlotController) -> None:
    store.subscribe(lambda s: controller.set_limit(s.max_concurrent_step_tasks))


# -- defaults and validation -------------------------------------------------------------


def test_missing_file_yields_the_unrestricted_default(path: Path) -> None:
    store = SettingsStore(path)
    assert store.load() == RuntimeSettings()
    assert store.current.max_concurrent_step_tasks == 0
    assert not path.exists()  # loading never creates the file


def test_empty_file_yields_defaults(path: Path) -> None:
    path.parent.mkdir(parents=True)
    path.write_text("")
    assert SettingsStore(path).load() == RuntimeSettings()


def test_positive_limit_is_accepted() -> None:
    assert RuntimeSettings(max_concurrent_step_tasks=4).max_concurrent_step_tasks == 4


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(-1, id="negative"),
        pytest.param("4", id="numeric-string"),
        pytest.param("4.5", id="decimal-string"),
        pytest.param(4.5, id="float"),
        pytest.param(True, id="bool"),
        pytest.param(None, id="none"),
    ],
)
def test_model_rejects_invalid_values(value: object) -> None:
    with pytest.raises(ValidationError):
        RuntimeSettings.model_validate({KEY: value})


def test_model_rejects_unknown_keys() -> None:
    with pytest.raises(ValidationError):
        RuntimeSettings.model_validate({"max_concurrent_step_task": 4})
    assert RuntimeSettings.known_keys() == (KEY,)


def test_default_path_uses_airuntime_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("AIRUNTIME_HOME", str(tmp_path / "ah"))
    assert default_settings_path() == tmp_path / "ah" / "runtime" / "settings.yaml"
    assert SettingsStore().path == default_settings_path()


@pytest.mark.parametrize("value", [pytest.param(None, id="unset"), pytest.param("", id="empty")])
def test_default_path_falls_back_to_home_dot_airuntime(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, value: str | None
) -> None:
    if value is None:
        monkeypatch.delenv("AIRUNTIME_HOME", raising=False)
    else:
        monkeypatch.setenv("AIRUNTIME_HOME", value)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_settings_path() == tmp_path / ".airuntime" / "runtime" / "settings.yaml"


# -- persist / reload; invalid updates preserve the last value ---------------------------


def test_limit_persists_and_invalid_updates_preserve_the_last_value(path: Path) -> None:
    store = SettingsStore(path)
    controller = StepSlotController(store.load().max_concurrent_step_tasks)
    bind(store, controller)

    assert store.set(KEY, "4").max_concurrent_step_tasks == 4
    assert controller.limit == 4
    assert yaml.safe_load(path.read_text()) == {KEY: 4}
    assert SettingsStore(path).load().max_concurrent_step_tasks == 4  # reload
    before = path.read_bytes()

    for bad in ("-1", "abc", "4.5", "", True, -1):
        with pytest.raises(SettingsError):
            store.set(KEY, bad)
        assert path.read_bytes() == before
        assert store.current.max_concurrent_step_tasks == 4
        assert controller.limit == 4

    store.set(KEY, 0)
    assert SettingsStore(path).load().max_concurrent_step_tasks == 0
    assert controller.limit == 0


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        pytest.param("4", 4, id="string"),
        pytest.param(" 7\n", 7, id="surrounding-whitespace"),
        pytest.param("+2", 2, id="explicit-sign"),
        pytest.param("0", 0, id="zero-string"),
        pytest.param(3, 3, id="int"),
    ],
)
def test_cli_values_are_parsed(path: Path, raw: str | int, expected: int) -> None:
    assert SettingsStore(path).set(KEY, raw).max_concurrent_step_tasks == expected


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        pytest.param("abc", "'abc'", id="word"),
        pytest.param("-1", "'-1'", id="negative-string"),
        pytest.param("4.5", "'4.5'", id="decimal-string"),
        pytest.param("", "''", id="empty"),
        pytest.param(-1, "-1", id="negative-int"),
        pytest.param(True, "True", id="bool"),
    ],
)
def test_invalid_cli_values_are_rejected_naming_key_and_value(
    path: Path, raw: str | int, shown: str
) -> None:
    store = SettingsStore(path)
    store.set(KEY, 2)
    with pytest.raises(SettingsError) as raised:
        store.set(KEY, raw)
    assert str(raised.value) == f"{KEY}: must be an integer >= 0, got {shown}"
    assert store.current.max_concurrent_step_tasks == 2
    assert SettingsStore(path).load().max_concurrent_step_tasks == 2


def test_unknown_key_is_rejected_listing_known_keys(path: Path) -> None:
    store = SettingsStore(path)
    calls: list[RuntimeSettings] = []
    store.subscribe(calls.append)
    with pytest.raises(SettingsError, match=r"unknown setting 'max_tasks'.*known settings: "):
        store.set("max_tasks", "4")
    with pytest.raises(SettingsError) as raised:
        store.set("nope", 1)
    assert str(raised.value) == f"unknown setting 'nope' (known settings: {KEY})"
    assert not path.exists()
    assert calls == []


# -- invalid file content ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "detail"),
    [
        pytest.param(f"{KEY}: -3\n", f"{KEY}: must be an integer >= 0, got -3", id="negative"),
        pytest.param(f"{KEY}: 4.5\n", f"{KEY}: must be an integer >= 0, got 4.5", id="float"),
        pytest.param(f"{KEY}: true\n", f"{KEY}: must be an integer >= 0, got True", id="bool"),
        pytest.param(f"{KEY}: four\n", f"{KEY}: must be an integer >= 0, got 'four'", id="word"),
        pytest.param(
            "max_tasks: 4\n",
            f"unknown setting 'max_tasks' (known settings: {KEY})",
            id="unknown-key",
        ),
        pytest.param("- 4\n", "expected a mapping of setting: value, got list", id="not-mapping"),
    ],
)
def test_invalid_file_content_names_the_file_key_and_value(
    path: Path, content: str, detail: str
) -> None:
    path.parent.mkdir(parents=True)
    path.write_text(content)
    with pytest.raises(SettingsFileError) as raised:
        SettingsStore(path).load()
    assert str(raised.value) == f"{path}: {detail}"
    assert raised.value.path == path


def test_malformed_yaml_is_reported_with_the_file_path(path: Path) -> None:
    path.parent.mkdir(parents=True)
    path.write_text(f"{KEY}: [4\n")
    with pytest.raises(SettingsFileError, match=r"invalid YAML") as raised:
        SettingsStore(path).load()
    assert str(raised.value).startswith(f"{path}: ")


def test_reloading_an_invalid_file_keeps_the_live_value(path: Path) -> None:
    store = SettingsStore(path)
    controller = StepSlotController()
    bind(store, controller)
    store.set(KEY, 3)
    path.write_text(f"{KEY}: -3\n")  # manual edit
    with pytest.raises(SettingsFileError, match="got -3"):
        store.load()
    assert store.current.max_concurrent_step_tasks == 3
    assert controller.limit == 3


def test_manual_edits_take_effect_when_settings_are_loaded(path: Path) -> None:
    store = SettingsStore(path)
    controller = StepSlotController()
    bind(store, controller)
    store.set(KEY, 3)
    path.write_text(f"{KEY}: 6\n")
    assert controller.limit == 3
    store.load()
    assert controller.limit == 6


# -- atomic persistence ------------------------------------------------------------------


def test_save_creates_parent_directories_and_fsyncs_before_replacing(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append("fsync")
        real_fsync(fd)

    def replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        events.append("replace")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    SettingsStore(path).save(RuntimeSettings(max_concurrent_step_tasks=5))
    assert events[:2] == ["fsync", "replace"]
    assert yaml.safe_load(path.read_text()) == {KEY: 5}
    assert sorted(p.name for p in path.parent.iterdir()) == ["settings.yaml"]


def test_failed_write_leaves_the_previous_file_intact(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SettingsStore(path)
    store.set(KEY, 4)
    before = path.read_bytes()

    def failing_replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="disk full"):
        store.set(KEY, 8)
    assert path.read_bytes() == before
    assert store.current.max_concurrent_step_tasks == 4  # live value unchanged too
    assert sorted(p.name for p in path.parent.iterdir()) == ["settings.yaml"]  # no temp file


def test_save_preserves_the_file_mode(path: Path) -> None:
    store = SettingsStore(path)
    store.set(KEY, 1)
    path.chmod(0o640)
    store.set(KEY, 2)
    assert path.stat().st_mode & 0o777 == 0o640


# -- subscribers -------------------------------------------------------------------------


async def test_subscriber_updates_a_live_controller_and_admits_waiters(path: Path) -> None:
    store = SettingsStore(path)
    store.set(KEY, 1)
    controller = StepSlotController(store.current.max_concurrent_step_tasks)
    bind(store, controller)

    first = controller.slot("e1")
    await first.__aenter__()
    second_entered = False

    async def second() -> None:
        nonlocal second_entered
        async with controller.slot("e2"):
            second_entered = True

    task = asyncio.create_task(second())
    for _ in range(5):
        await asyncio.sleep(0)
    assert controller.queued == 1

    store.set(KEY, "2")  # live update through the settings API
    await task
    assert second_entered
    await first.__aexit__(None, None, None)
    assert controller.active == 0


def test_unsubscribe_stops_notifications(path: Path) -> None:
    store = SettingsStore(path)
    seen: list[int] = []
    unsubscribe = store.subscribe(lambda s: seen.append(s.max_concurrent_step_tasks))
    store.set(KEY, 1)
    unsubscribe()
    unsubscribe()  # idempotent
    store.set(KEY, 2)
    assert seen == [1]


def test_every_subscriber_is_notified_even_if_one_fails(path: Path) -> None:
    store = SettingsStore(path)
    seen: list[int] = []

    def broken(settings: RuntimeSettings) -> None:
        raise RuntimeError("subscriber failed")

    store.subscribe(broken)
    store.subscribe(lambda s: seen.append(s.max_concurrent_step_tasks))
    with pytest.raises(RuntimeError, match="subscriber failed"):
        store.set(KEY, 3)
    assert seen == [3]
    assert SettingsStore(path).load().max_concurrent_step_tasks == 3
