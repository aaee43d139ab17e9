"""What every ``airt`` command shares: its consoles, its exit codes, how it refuses
input, and how its options and the environment become validated settings.

Why this exists: ``airt`` is one program made of several command modules (and of
plugins from other packages, such as ``airt runtime``). A person must meet one
behaviour everywhere: results on stdout, diagnostics on stderr, ``error: ...`` and
exit 2 for anything invalid -- an option, a variable, a file --, never a traceback.

Exit codes: 0 success, 1 the work failed (an execution failed or was cancelled),
2 invalid input.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Final, TypeVar

import typer
import yaml
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table
from rich.text import Text

from airuntime.core.settings import REDIS_URL_ENV, EnvSettings
from airuntime.core.validation import format_validation_error
from airuntime.engine.pipeline import PipelineError, Plan, compile_pipeline, load_pipeline
from airuntime.examples import pipeline_path

__all__ = [
    "EXIT_FAILED",
    "EXIT_INVALID",
    "EXIT_OK",
    "RedisUrl",
    "compile_argument",
    "configure_logs_or_exit",
    "console",
    "error_line",
    "invalid",
    "out",
    "parse_kv",
    "pipeline_document",
    "print_table",
    "setting_option",
    "settings_from_options",
]

console = Console(stderr=True, markup=False, soft_wrap=True)
"""Diagnostics and progress (stderr). A message is one line, never wrapped by rich (a
terminal wraps it; a log or a pipe keeps it whole, ids and URLs unbroken). Neither
console reads rich markup in what it prints: messages, table cells and listings carry
what tenants wrote (a step's output, an error's text), and ``[/x]`` in it would be a
``MarkupError`` -- a traceback instead of the run. Style goes through ``style=`` or
:class:`~rich.text.Text`."""
out = Console(markup=False, soft_wrap=True)
"""Results (stdout): every line whole (a JSON document wrapped at 80 columns in a pipe
had line breaks inside its strings); tables go through :func:`print_table`."""

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_INVALID: Final = 2

S = TypeVar("S", bound=EnvSettings)

RedisUrl = Annotated[str | None, typer.Option("--redis-url", envvar=REDIS_URL_ENV)]
"""The ``--redis-url`` option of a command that reads nothing else from the environment."""


def print_table(table: Table, console: Console = out) -> None:
    """Print ``table`` fitted to the console's width (printed ``soft_wrap`` it would be
    laid out a column wider than the terminal)."""
    console.print(table, soft_wrap=False)


def error_line(message: str) -> Text:
    """``error: <message>``, the prefix red, the message as written."""
    return Text.assemble(("error:", "red"), " ", message)


def invalid(message: str) -> typer.Exit:
    """Print ``error: <message>`` on stderr; the exit-2 to raise."""
    console.print(error_line(message), highlight=False)
    return typer.Exit(EXIT_INVALID)


def configure_logs_or_exit() -> None:
    """A long-running command's log (:mod:`airuntime.core.log_output`), configured
    before it starts anything; a malformed ``AIRUNTIME_LOG_*`` is an exit 2 naming it."""
    from airuntime.core.log_output import LogSettings, configure_logs

    try:
        settings = LogSettings()
    except ValidationError as exc:
        raise invalid(format_validation_error(exc, where=LogSettings.env_var)) from None
    configure_logs(settings.log_level, settings.log_format)


def secrets_keys_or_exit() -> None:
    """``AIRUNTIME_SECRETS_KEYS`` read now and kept for the process (a runtime scrubs its
    credentials from the environment next); malformed, an exit 2 naming it."""
    from airuntime.core.errors import ConfigError
    from airuntime.engine.secret_sealing import pin_sealer

    try:
        pin_sealer()
    except ConfigError as exc:
        raise invalid(str(exc)) from None


def handler_policy_or_exit() -> None:
    """The platform's handler policy (:mod:`airuntime.engine.handlers.settings`: the
    ``python`` modules, the ``http`` bounds, the model providers) and the keys tenant
    secrets are sealed under (``AIRUNTIME_SECRETS_KEYS``), read before anything
    starts: a malformed variable is an exit 2 naming it, not a traceback or a 500 at the
    first pipeline compiled. The providers' JSON is not echoed (the message names the
    provider and the field)."""
    from airuntime.core.errors import ConfigError
    from airuntime.engine.handlers.settings import HandlerSettings, handler_settings
    from airuntime.engine.secret_sealing import configured_sealer

    try:
        handler_settings()
    except ValidationError as exc:
        quoted = exc.errors()[0]["loc"][:1] != ("model_providers",)
        message = format_validation_error(exc, where=HandlerSettings.env_var, with_value=quoted)
        raise invalid(message) from None
    try:
        configured_sealer()  # the keys tenant secrets are sealed under (never echoed)
    except ConfigError as exc:
        raise invalid(str(exc)) from None


def collector_threshold_or_exit() -> int:
    """``AIRUNTIME_GC_GEN0_THRESHOLD`` (:mod:`airuntime.core.gc_tuning`); a malformed
    value is an exit 2 naming it."""
    from airuntime.core.gc_tuning import gen0_threshold_from_env

    try:
        return gen0_threshold_from_env()
    except ValueError as exc:
        raise invalid(str(exc)) from None


def tune_collector_or_exit(threshold: int | None = None) -> None:
    """A long-running command's garbage collector settings, applied once its imports and
    settings are done (``threshold``: as :func:`collector_threshold_or_exit` read it
    earlier; None reads it now)."""
    from airuntime.core.gc_tuning import tune_collector

    tune_collector(collector_threshold_or_exit() if threshold is None else threshold)


def parse_kv(items: list[str], option: str) -> dict[str, Any]:
    """``NAME=VALUE`` options as a dict; a VALUE that is JSON is decoded, else kept as text."""
    values: dict[str, Any] = {}
    for item in items:
        name, sep, raw = item.partition("=")
        if not sep or not name:
            raise invalid(f"{option}: expected NAME=VALUE, got {item!r}")
        try:
            values[name] = json.loads(raw)
        except json.JSONDecodeError:
            values[name] = raw
    return values


def compile_argument(argument: str) -> Plan:
    """The plan of a PIPELINE argument (a file or a packaged example's name)."""
    try:
        with pipeline_path(argument) as path:
            return compile_pipeline(load_pipeline(path))
    except (FileNotFoundError, PipelineError) as exc:
        raise invalid(str(exc)) from None


def pipeline_document(argument: str) -> Any:
    """The document of a PIPELINE argument, validated here first so a bad file is
    reported before anything is sent."""
    try:
        with pipeline_path(argument) as path:
            load_pipeline(path)
            return yaml.safe_load(path.read_text())
    except (FileNotFoundError, PipelineError) as exc:
        raise invalid(str(exc)) from None


def settings_from_options(model: type[S], ctx: typer.Context) -> S:
    """The command's settings: its options that were given, over ``AIRUNTIME_*``, over
    the defaults.

    An option counts when its parameter is named after a field of ``model`` and its
    value is not ``None`` (so options default to ``None`` and spell neither a variable
    nor a default). An invalid value exits 2 naming the option or the variable it came
    from, and the value.
    """
    given = {
        name: value
        for name, value in ctx.params.items()
        if name in model.model_fields and value is not None
    }
    flags = {p.name: p.opts[0] for p in ctx.command.params if p.name and p.opts}

    def where(loc: str) -> str:
        field = loc.split(".")[0]
        if not field:
            return "settings"
        return flags.get(field, field) if field in given else model.env_var(field)

    try:
        return model(**given)
    except ValidationError as exc:
        raise invalid(format_validation_error(exc, where=where)) from None


def setting_option(
    model: type[EnvSettings], field: str, *flags: str, text: str | None = None
) -> Any:
    """The option of a settings field, for :func:`settings_from_options`: default
    ``None`` (not given); its help is ``text`` (default: the field's description, which
    states the default) and names the variable it overrides."""
    about = " ".join((text or model.model_fields[field].description or "").split())
    help_text = f"{about.replace('``', '')} (env {model.env_var(field)})".strip()
    return typer.Option(*flags, help=help_text)
