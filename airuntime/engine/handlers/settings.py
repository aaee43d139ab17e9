"""What the platform lets tenant pipelines reach through the ``python``, ``http`` and
``model`` handlers.

Why this module exists: pipeline authors are untrusted tenants, but three built-in handlers
reach outside the engine on their behalf. ``python`` imports and calls code by name, so
without a bound a pipeline could call ``builtins:exec`` and read the runtime's own
credentials; ``http`` connects wherever a URL points, so without a bound a pipeline could
reach the Redis of the platform, the cloud metadata service or any cluster-internal
service; ``model`` sends the platform's provider keys, so only to the providers the
platform names. These bounds are the platform operator's decision, not the tenant's, so they are
process settings (``AIRUNTIME_*`` variables, the :class:`~airuntime.core.settings.EnvSettings`
idiom) read by every process that compiles or runs pipelines:

* ``AIRUNTIME_PYTHON_HANDLER_MODULES`` -- comma-separated module prefixes ``python``
  steps may call into (``mycompany.tools,tests.chaos``); default none, so no ``python``
  step compiles until the operator names the modules it trusts.
* ``AIRUNTIME_HTTP_HANDLER_DENY_CIDRS`` -- comma-separated extra networks ``http`` steps
  may not reach (the cluster's pod and service ranges when they are public addresses);
  the internal classes of :mod:`~airuntime.engine.handlers.egress` are always denied.
* ``AIRUNTIME_HTTP_HANDLER_ALLOW`` -- comma-separated networks (``10.1.2.0/24``) and host
  names (``api.internal``) that ``http`` steps may reach even though they are internal,
  e.g. a local test server on loopback.
* ``AIRUNTIME_MODEL_PROVIDERS`` -- a JSON object of the model providers ``model`` steps
  may call (:mod:`~airuntime.engine.handlers.model_providers`); default none.

Values are read when they are needed (each compile, each handler call), so a test or a
process that changes its environment sees the change; :func:`handler_settings` is that
read.
"""

from __future__ import annotations

import functools
import ipaddress
import os
import re
from typing import Annotated, Final

from pydantic import field_validator
from pydantic_settings import NoDecode

from airuntime.core.settings import EnvSettings
from airuntime.engine.handlers.model_providers import ModelProvider, parse_providers
from airuntime.engine.handlers.python_policy import ALWAYS_DENIED

__all__ = ["HandlerSettings", "IPNetwork", "handler_settings"]

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

_MODULE_PREFIX = re.compile(r"^[A-Za-z][A-Za-z0-9_]*(\.[A-Za-z][A-Za-z0-9_]*)*$")
_HOST_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]{0,62})(\.[A-Za-z0-9]([A-Za-z0-9-]{0,62}))*\.?$")


def _split(value: object) -> object:
    """A comma-separated variable becomes a tuple of its non-empty, stripped items."""
    if isinstance(value, str):
        return tuple(item.strip() for item in value.split(",") if item.strip())
    return value


class HandlerSettings(EnvSettings):
    """The tenant-facing bounds of the ``python``, ``http`` and ``model`` handlers (see the
    module doc)."""

    python_handler_modules: Annotated[tuple[str, ...], NoDecode] = ()
    """Module prefixes ``python`` steps may call (``pkg`` allows ``pkg`` and ``pkg.*``);
    default none: no ``python`` step is allowed."""
    http_handler_deny_cidrs: Annotated[tuple[IPNetwork, ...], NoDecode] = ()
    """Networks ``http`` steps may not reach, on top of the always-denied internal
    classes (loopback, link-local, private, CGNAT, unique-local, ...); default none."""
    http_handler_allow: Annotated[tuple[str, ...], NoDecode] = ()
    """Networks (CIDR or single address) and host names ``http`` steps may reach even
    when they are internal; default none."""
    model_providers: Annotated[dict[str, ModelProvider], NoDecode] = {}
    """The providers ``model`` steps may call, by name (a JSON object); default none."""

    @field_validator("python_handler_modules", mode="before")
    @classmethod
    def _modules(cls, value: object) -> object:
        value = _split(value)
        if isinstance(value, tuple | list):
            for item in value:
                if not isinstance(item, str) or not _MODULE_PREFIX.match(item):
                    raise ValueError(
                        f"{item!r} is not a module prefix (dotted names, no leading "
                        "underscore, e.g. 'mycompany.tools')"
                    )
                if item.split(".", 1)[0] in ALWAYS_DENIED:
                    raise ValueError(f"{item!r} may never be opened to python steps")
        return value

    @field_validator("http_handler_deny_cidrs", mode="before")
    @classmethod
    def _networks(cls, value: object) -> object:
        value = _split(value)
        if isinstance(value, tuple | list):
            return tuple(ipaddress.ip_network(str(v), strict=False) for v in value)
        return value

    @field_validator("http_handler_allow", mode="before")
    @classmethod
    def _allow(cls, value: object) -> object:
        value = _split(value)
        if isinstance(value, tuple | list):
            for item in value:
                if not isinstance(item, str) or not (_is_network(item) or _HOST_NAME.match(item)):
                    raise ValueError(f"{item!r} is neither a network (CIDR) nor a host name")
            return tuple(str(v).lower().rstrip(".") for v in value)
        return value

    @field_validator("model_providers", mode="before")
    @classmethod
    def _providers(cls, value: object) -> object:
        return parse_providers(value)

    def allowed_networks(self) -> tuple[IPNetwork, ...]:
        """The networks of ``http_handler_allow``."""
        return tuple(
            ipaddress.ip_network(item, strict=False)
            for item in self.http_handler_allow
            if _is_network(item)
        )

    def allowed_hosts(self) -> frozenset[str]:
        """The host names of ``http_handler_allow`` (lower case, no trailing dot)."""
        return frozenset(item for item in self.http_handler_allow if not _is_network(item))


def _is_network(text: str) -> bool:
    try:
        ipaddress.ip_network(text, strict=False)
    except ValueError:
        return False
    return True


def handler_settings() -> HandlerSettings:
    """The settings as the environment says right now (raises ``ValidationError`` on a
    malformed variable, naming it). Read once per distinct value of the variables
    (reading them through pydantic-settings costs milliseconds, and every compile --
    submit, intake, run start -- asks), so a changed variable is still seen at once."""
    return _settings_for(tuple(os.environ.get(v) for v in _VARIABLES))


_VARIABLES: Final = tuple(HandlerSettings.env_var(f) for f in HandlerSettings.model_fields)


@functools.lru_cache(maxsize=16)
def _settings_for(values: tuple[str | None, ...]) -> HandlerSettings:
    del values  # the cache key: HandlerSettings reads the same environment
    return HandlerSettings()
