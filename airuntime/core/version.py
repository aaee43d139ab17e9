"""The version of the installed airuntime distribution, in one place below every layer.

``airuntime.__version__`` and the stamp on every Lua script (so two releases sharing
one Redis never run each other's scripts) both come from here; reading it from the
package metadata keeps pyproject.toml the only place the number is written.
"""

from __future__ import annotations

from functools import cache


@cache
def installed_version() -> str:
    """The installed distribution's version, ``0+unknown`` from a never-installed tree."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("airuntime")
    except PackageNotFoundError:
        return "0+unknown"
