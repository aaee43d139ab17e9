"""Settings of the airuntime operator, read once from the environment.

Why a module of its own: the same settings drive ``airt operator`` / ``python -m
airuntime_operator`` (from the environment of the operator's pod, which the Helm chart
writes) and the tests (built explicitly), and every tunable the operator has is listed
-- with its variable, unit, default and reason -- in one place, like kopf's own
``OperatorSettings``. They are a ``pydantic-settings`` model, the configuration idiom of
airuntime: the environment is parsed and validated by the model, and
:meth:`OperatorSettings.from_env` turns a refusal into one :class:`SettingsError` that
names each variable and its value (``airt operator`` exits 2 with it).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Final

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

import airuntime
from airuntime.core.log_output import LogFormat, LogLevel, LogSettings, known_level
from airuntime.core.redis_client import CLUSTER_ENV
from airuntime.engine.handlers.model_providers import MODEL_PROVIDERS_ENV, parse_providers
from airuntime.engine.handlers.settings import HandlerSettings
from airuntime.engine.secret_sealing import SECRETS_KEYS_ENV
from airuntime.fleet.instance_settings import RUNTIME_TOKEN_ENV

__all__ = ["RUNTIME_IMAGE_REPOSITORY", "OperatorSettings", "SettingsError", "default_runtime_image"]

ENV_PREFIX: Final = "AIRUNTIME_"
RUNTIME_IMAGE_REPOSITORY: Final = "ghcr.io/airuntime/airuntime"


PYTHON_MODULES_ENV: Final = "AIRUNTIME_PYTHON_HANDLER_MODULES"
HTTP_DENY_ENV: Final = "AIRUNTIME_HTTP_HANDLER_DENY_CIDRS"
HTTP_ALLOW_ENV: Final = "AIRUNTIME_HTTP_HANDLER_ALLOW"
HISTORY_DSN_ENV: Final = "AIRUNTIME_HISTORY_DSN"
LOG_FORMAT_ENV: Final = LogSettings.env_var("log_format")
LOG_LEVEL_ENV: Final = LogSettings.env_var("log_level")


def _var(suffix: str) -> str:
    """The environment variable of an operator-only setting."""
    return f"{ENV_PREFIX}OPERATOR_{suffix}"


def default_runtime_image() -> str:
    """The runtime image of the installed release: ``<repository>:<package version>``."""
    try:
        release = version("airuntime")
    except PackageNotFoundError:  # running from a source tree that was never installed
        release = airuntime.__version__
    return f"{RUNTIME_IMAGE_REPOSITORY}:{release}"


class SettingsError(ValueError):
    """An operator setting in the environment is missing or malformed."""


class OperatorSettings(BaseSettings):
    """Everything the operator needs besides the cluster's custom resources."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_ignore_empty=True,  # VAR="" means the default, as the chart writes optional values
        populate_by_name=True,
        frozen=True,
        use_attribute_docstrings=True,
    )

    redis_url: str = Field(min_length=1)
    """URL of the Redis the runtimes register in and tenant settings are published to
    (``AIRUNTIME_REDIS_URL``, required, no default). The operator only reads the
    registry and writes tenant settings; it never touches execution state."""

    redis_cluster: bool = Field(default=False, validation_alias=CLUSTER_ENV)
    """``AIRUNTIME_REDIS_CLUSTER=1`` (the chart's ``redis.cluster``): the Redis URL is a
    Redis/Valkey Cluster's. The operator's own client follows it, and every runtime pod
    gets the variable too (platform env), so a plain ``redis://`` seed URL works for
    all of them. Default off."""

    kubeconfig: str | None = Field(default=None, validation_alias="KUBECONFIG")
    """Path of a kubeconfig file (``KUBECONFIG``). Default ``None``: the in-cluster
    service account, which is how the operator runs in its pod."""

    namespaces: tuple[str, ...] = Field(default=(), validation_alias=_var("NAMESPACES"))
    """Namespaces (or kopf glob patterns) to serve (``AIRUNTIME_OPERATOR_NAMESPACES``,
    comma-separated). Default empty: the whole cluster (a ClusterRoleBinding)."""

    peering_name: str = Field(default="airuntime", min_length=1, validation_alias=_var("PEERING"))
    """kopf peering object shared by the operator's replicas, so that only one of them
    (the highest priority) handles resources at a time (``AIRUNTIME_OPERATOR_PEERING``,
    default ``airuntime``)."""

    standalone: bool = Field(default=False, validation_alias=_var("STANDALONE"))
    """Run without peering (``AIRUNTIME_OPERATOR_STANDALONE=1``; default off): for a
    single replica, tests and local development."""

    priority: int | None = Field(default=None, validation_alias=_var("PRIORITY"))
    """kopf peering priority of this replica (``AIRUNTIME_OPERATOR_PRIORITY``); the
    highest live priority handles resources, the others stand by. Default ``None``: a
    random one, so that replicas never tie."""

    liveness_endpoint: str | None = Field(default=None, validation_alias=_var("LIVENESS"))
    """kopf's liveness probe endpoint, e.g. ``http://0.0.0.0:8080/healthz``
    (``AIRUNTIME_OPERATOR_LIVENESS``). Default ``None``: no probe server."""

    runtime_image: str = Field(
        default_factory=default_runtime_image, min_length=1, validation_alias=_var("RUNTIME_IMAGE")
    )
    """Image of runtime pods whose pool sets no ``spec.image``
    (``AIRUNTIME_OPERATOR_RUNTIME_IMAGE``). Default: the image of the installed
    release, ``ghcr.io/airuntime/airuntime:<package version>``, so an operator never
    starts runtimes of another version than its own."""

    status_interval_seconds: float = Field(
        default=10.0, gt=0, validation_alias=_var("STATUS_INTERVAL")
    )
    """Seconds between refreshes of a pool's ``readyReplicas``, ``visibleInstances`` and
    Ready condition (``AIRUNTIME_OPERATOR_STATUS_INTERVAL``, default 10). The registry
    lives in Redis, which has no watch, so it is polled; a status is only patched when
    it changed."""

    fulfilment_poll_seconds: float = Field(
        default=2.0, gt=0, validation_alias=_var("FULFILMENT_POLL")
    )
    """Seconds between checks of an Observed scale-out request for a new, ready runtime
    instance (``AIRUNTIME_OPERATOR_FULFILMENT_POLL``, default 2): the delay a waiting
    run can add on top of the pod's start."""

    fulfilment_timeout_seconds: float = Field(
        default=900.0, gt=0, validation_alias=_var("FULFILMENT_TIMEOUT")
    )
    """Seconds after which an Observed request with no new ready instance is Rejected,
    so the control plane stops waiting for it (``AIRUNTIME_OPERATOR_FULFILMENT_TIMEOUT``,
    default 900: long enough for an image pull and a cold node)."""

    retention_seconds: float = Field(default=3600.0, gt=0, validation_alias=_var("RETENTION"))
    """Seconds a Fulfilled or Rejected scale-out request is kept (to be inspected) before
    it is deleted (``AIRUNTIME_OPERATOR_RETENTION``, default 3600: one hour)."""

    gc_interval_seconds: float = Field(default=60.0, gt=0, validation_alias=_var("GC_INTERVAL"))
    """Seconds between checks of a finished request against the retention
    (``AIRUNTIME_OPERATOR_GC_INTERVAL``, default 60)."""

    registry_cache_seconds: float = Field(
        default=0.5, ge=0, validation_alias=_var("REGISTRY_CACHE")
    )
    """Seconds one read of the Redis registry is reused by every pool and request
    (``AIRUNTIME_OPERATOR_REGISTRY_CACHE``, default 0.5), which bounds the registry
    reads per second regardless of the number of resources."""

    scale_in: bool = Field(default=True, validation_alias=_var("SCALE_IN"))
    """Remove idle runtime pods of a pool after its ``idleScaleInDelaySeconds``
    (``AIRUNTIME_OPERATOR_SCALE_IN``, default on; off when something else, e.g. an HPA,
    owns the replicas)."""

    pool_events: bool = Field(default=True, validation_alias=_var("POOL_EVENTS"))
    """Post informational events on RuntimePools -- Reconciled (when applying the spec
    changed something), ScaledIn, Deleted -- (``AIRUNTIME_OPERATOR_POOL_EVENTS``, default
    on). Off, a fleet of pools costs one API request less per reconcile; warnings are
    posted either way, and the status conditions say the same as the events."""

    api_threads: int = Field(default=8, ge=1, validation_alias=_var("API_THREADS"))
    """Threads running blocking Kubernetes API calls (``AIRUNTIME_OPERATOR_API_THREADS``,
    default 8): the operator's API requests in flight at once."""

    field_manager: str = Field(
        default="airuntime-operator", min_length=1, validation_alias=_var("FIELD_MANAGER")
    )
    """Server-side-apply field manager and user agent of the operator's own requests
    (``AIRUNTIME_OPERATOR_FIELD_MANAGER``, default ``airuntime-operator``): what
    ``managedFields`` and the API server's audit log name as the writer."""

    extra_labels: dict[str, str] = Field(
        default_factory=dict, validation_alias=_var("EXTRA_LABELS")
    )
    """Labels added to every object the operator creates
    (``AIRUNTIME_OPERATOR_EXTRA_LABELS``, comma-separated ``name=value`` pairs; default
    none), e.g. for cost allocation."""

    runtime_token_secret: str | None = Field(
        default=None, min_length=1, validation_alias=_var("RUNTIME_TOKEN_SECRET")
    )
    """Secret holding the runtime token (``AIRUNTIME_OPERATOR_RUNTIME_TOKEN_SECRET``; it
    must exist in each pool's namespace). Every runtime pod gets ``AIRUNTIME_RUNTIME_TOKEN``
    from it through a secretKeyRef, so the control plane (which reads the same Secret)
    can deliver runs to the pod's intake. Default ``None``: no token, and the runtimes'
    intake answers 401."""

    runtime_token_key: str = Field(
        default="token", min_length=1, validation_alias=_var("RUNTIME_TOKEN_KEY")
    )
    """Key of the runtime token in that Secret (``AIRUNTIME_OPERATOR_RUNTIME_TOKEN_KEY``,
    default ``token``)."""

    secrets_keys_secret: str | None = Field(
        default=None, min_length=1, validation_alias=_var("SECRETS_KEYS_SECRET")
    )
    """Secret holding the keys tenant secrets are sealed under
    (``AIRUNTIME_OPERATOR_SECRETS_KEYS_SECRET``; it must exist in each pool's namespace).
    Every runtime pod gets ``AIRUNTIME_SECRETS_KEYS`` from it through a secretKeyRef, so
    it opens what the control plane (which reads the same Secret) sealed. Default
    ``None``: runtimes hold no key, and read only values stored as written."""

    secrets_keys_key: str = Field(
        default="keys", min_length=1, validation_alias=_var("SECRETS_KEYS_KEY")
    )
    """Key of the keys in that Secret (``AIRUNTIME_OPERATOR_SECRETS_KEYS_KEY``, default
    ``keys``)."""

    history_secret: str | None = Field(
        default=None, min_length=1, validation_alias=_var("HISTORY_SECRET")
    )
    """Secret holding the durable history's DSN (``AIRUNTIME_OPERATOR_HISTORY_SECRET``;
    it must exist in each pool's namespace). Every runtime pod gets
    ``AIRUNTIME_HISTORY_DSN`` from it through a secretKeyRef and writes step outputs over
    the payload threshold there, as the control plane reads them. Default ``None``: the
    runtimes keep every output in Redis."""

    history_secret_key: str = Field(
        default="dsn", min_length=1, validation_alias=_var("HISTORY_SECRET_KEY")
    )
    """Key of the DSN in that Secret (``AIRUNTIME_OPERATOR_HISTORY_SECRET_KEY``, default
    ``dsn``)."""

    python_handler_modules: str = Field(default="", validation_alias=PYTHON_MODULES_ENV)
    """The platform's ``AIRUNTIME_PYTHON_HANDLER_MODULES``, passed on unchanged to every
    runtime pod (default empty: no ``python`` step runs). The operator always sets it and
    the two ``http`` variables below, replacing what a pool's ``env`` says: the handler
    policy is the platform's, not the pool author's."""

    http_handler_deny_cidrs: str = Field(default="", validation_alias=HTTP_DENY_ENV)
    """The platform's ``AIRUNTIME_HTTP_HANDLER_DENY_CIDRS`` for runtime pods."""

    http_handler_allow: str = Field(default="", validation_alias=HTTP_ALLOW_ENV)
    """The platform's ``AIRUNTIME_HTTP_HANDLER_ALLOW`` for runtime pods."""

    model_providers: str = Field(default="", validation_alias=MODEL_PROVIDERS_ENV)
    """The platform's ``AIRUNTIME_MODEL_PROVIDERS`` (a JSON object) for runtime pods: the
    model providers ``model`` steps may call."""

    model_keys_secret: str | None = Field(
        default=None, min_length=1, validation_alias=_var("MODEL_KEYS_SECRET")
    )
    """Secret holding the model providers' keys (``AIRUNTIME_OPERATOR_MODEL_KEYS_SECRET``;
    it must exist in each pool's namespace), one entry per ``api_key_env`` named by a
    provider, under that name. Every runtime pod gets each such variable from it through
    an optional secretKeyRef (an entry missing: the variable is unset, and that
    provider's steps fail saying so). Default ``None``: no keys are passed on."""

    log_level: str = Field(default="INFO", validation_alias=_var("LOG_LEVEL"))
    """Level of the operator's log (``AIRUNTIME_OPERATOR_LOG_LEVEL``: DEBUG, INFO,
    WARNING, ERROR; default INFO)."""

    log_format: LogFormat = Field(default=LogFormat.TEXT, validation_alias=LOG_FORMAT_ENV)
    """Format of the operator's log and of every runtime pod's (``AIRUNTIME_LOG_FORMAT``:
    ``text``, one line a record, or ``json``, one object a line; default text)."""

    runtime_log_level: LogLevel | None = Field(default=None, validation_alias=LOG_LEVEL_ENV)
    """Level of every runtime pod's log (``AIRUNTIME_LOG_LEVEL``, passed on: DEBUG,
    INFO, WARNING, ERROR, CRITICAL). Default ``None``: the runtimes' own default, INFO.
    The operator's own level is ``AIRUNTIME_OPERATOR_LOG_LEVEL``, and this one when
    that is unset (the chart always sets it, from ``operator.logLevel``)."""

    @field_validator("namespaces", mode="before")
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(n.strip() for n in value.split(",") if n.strip())
        return value

    @field_validator("extra_labels", mode="before")
    @classmethod
    def _label_pairs(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        labels: dict[str, str] = {}
        for pair in (p.strip() for p in value.split(",") if p.strip()):
            name, sep, label = pair.partition("=")
            if not sep or not name.strip():
                raise ValueError("must be comma-separated name=value pairs")
            labels[name.strip()] = label.strip()
        return labels

    _runtime_level_in_any_case = field_validator("runtime_log_level", mode="before")(known_level)

    @field_validator("log_level")
    @classmethod
    def _known_level(cls, value: str) -> str:
        level = value.strip().upper()
        if level not in logging.getLevelNamesMapping():
            raise ValueError("must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL")
        return level

    @model_validator(mode="after")
    def _valid_handler_policy(self) -> OperatorSettings:
        """The runtimes would refuse a malformed policy at start: refuse it here first."""
        fields = (
            "python_handler_modules",
            "http_handler_deny_cidrs",
            "http_handler_allow",
            "model_providers",
        )
        for field in fields:
            value = getattr(self, field)
            try:
                HandlerSettings.model_validate({field: value})
            except ValidationError as exc:
                problem = exc.errors()[0]["msg"].removeprefix("Value error, ")
                # The providers' JSON is not echoed: the problem names provider and field.
                shown = "" if field == "model_providers" else f"={value!r}"
                raise ValueError(f"{env_var(field)}{shown}: {problem}") from None
        return self

    def runtime_platform_env(self) -> list[dict[str, Any]]:
        """The variables every runtime pod gets from the platform, whatever its pool says."""
        env: list[dict[str, Any]] = [
            {"name": PYTHON_MODULES_ENV, "value": self.python_handler_modules},
            {"name": HTTP_DENY_ENV, "value": self.http_handler_deny_cidrs},
            {"name": HTTP_ALLOW_ENV, "value": self.http_handler_allow},
            {"name": MODEL_PROVIDERS_ENV, "value": self.model_providers},
        ]
        if self.model_keys_secret:
            providers = parse_providers(self.model_providers).values()
            variables = sorted({p.api_key_env for p in providers if p.api_key_env})
            for variable in variables:
                ref = {"name": self.model_keys_secret, "key": variable, "optional": True}
                env.append({"name": variable, "valueFrom": {"secretKeyRef": ref}})
        if self.runtime_token_secret:
            ref = {"name": self.runtime_token_secret, "key": self.runtime_token_key}
            env.append({"name": RUNTIME_TOKEN_ENV, "valueFrom": {"secretKeyRef": ref}})
        if self.secrets_keys_secret:
            ref = {"name": self.secrets_keys_secret, "key": self.secrets_keys_key}
            env.append({"name": SECRETS_KEYS_ENV, "valueFrom": {"secretKeyRef": ref}})
        if self.history_secret:
            ref = {"name": self.history_secret, "key": self.history_secret_key}
            env.append({"name": HISTORY_DSN_ENV, "valueFrom": {"secretKeyRef": ref}})
        if self.redis_cluster:
            env.append({"name": CLUSTER_ENV, "value": "1"})
        env.append({"name": LOG_FORMAT_ENV, "value": self.log_format.value})
        if self.runtime_log_level:
            env.append({"name": LOG_LEVEL_ENV, "value": self.runtime_log_level})
        return env

    @property
    def clusterwide(self) -> bool:
        return not self.namespaces

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Arguments, then the environment; no dotenv or secrets files."""
        return init_settings, _Environment(settings_cls)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> OperatorSettings:
        """The settings in ``environ`` (default: ``os.environ``) and nothing else.

        Raises :class:`SettingsError` naming every variable that is missing or malformed,
        with its value.
        """
        try:
            return cls.model_validate(_Environment(cls, environ)())
        except ValidationError as exc:
            raise SettingsError(" ".join(_explain(error) for error in exc.errors())) from None


class _Environment(EnvSettingsSource):
    """The environment source: ``os.environ``, or the given mapping.

    Lists stay strings here (the model's validators split them): the stock source would
    decode them as JSON.
    """

    _RAW: Final = frozenset({"namespaces", "extra_labels"})

    def __init__(
        self, settings_cls: type[BaseSettings], environ: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(settings_cls)
        if environ is not None:
            # As the stock source reads os.environ: case-insensitive, "" ignored.
            self.env_vars = {k.lower(): v for k, v in environ.items() if v != ""}

    def prepare_field_value(
        self, field_name: str, field: FieldInfo, value: Any, value_is_complex: bool
    ) -> Any:
        if field_name in self._RAW:
            return value
        return super().prepare_field_value(field_name, field, value, value_is_complex)


def env_var(field_name: str) -> str:
    """The environment variable of the setting ``field_name``."""
    alias = OperatorSettings.model_fields[field_name].validation_alias
    return alias if isinstance(alias, str) else f"{ENV_PREFIX}{field_name.upper()}"


_KINDS: Final = {
    "float_parsing": "a number",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "bool_parsing": "a boolean (1/0, true/false, yes/no, on/off)",
}


def _field_of(key: str) -> str:
    """The field a validation error's location names (by alias or by name)."""
    for name in OperatorSettings.model_fields:
        if key in (name, env_var(name)):
            return name
    return key


def _explain(error: ErrorDetails) -> str:
    """One sentence naming the variable, its value and what is wrong with it."""
    if not error["loc"] and error["type"] == "value_error":  # a whole-model check: it names
        return f"{(error.get('ctx') or {}).get('error')}."  # the variable itself
    key = str(error["loc"][0]) if error["loc"] else "settings"
    field = _field_of(key)
    var = env_var(field) if field in OperatorSettings.model_fields else field
    if key == field and field in OperatorSettings.model_fields:
        # Read by its name, not its alias: ``AIRUNTIME_LOG_LEVEL`` for ``log_level``
        # (the level of every process, which the operator's own defaults to).
        var = f"{ENV_PREFIX}{field.upper()}"
    value, kind = error.get("input"), error["type"]
    if kind == "missing":
        return f"{var} is not set; the operator needs it."
    if kind in _KINDS:
        return f"{var} must be {_KINDS[kind]}, not {value!r}."
    context = error.get("ctx") or {}
    if kind == "greater_than" and context.get("gt") == 0:
        problem = "must be positive"
    elif kind == "greater_than_equal":
        problem = f"must be at least {context.get('ge')}"
    elif kind == "value_error":
        problem = str(context.get("error"))
    else:
        problem = error["msg"].lower()
    return f"{var}={value!r}: {field} {problem}."
