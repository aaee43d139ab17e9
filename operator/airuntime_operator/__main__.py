"""``python -m airuntime_operator``: run the operator with settings from the environment.

Peering named ``airuntime`` (HA) unless ``AIRUNTIME_OPERATOR_STANDALONE=1``; see
:class:`~airuntime_operator.settings.OperatorSettings` for every variable.
"""

from __future__ import annotations

import sys

from airuntime.core.log_output import configure_logs
from airuntime_operator.runner import run
from airuntime_operator.settings import OperatorSettings, SettingsError


def main() -> int:
    try:
        settings = OperatorSettings.from_env()
    except SettingsError as exc:
        print(f"airuntime operator: {exc}", file=sys.stderr)
        return 2
    configure_logs(settings.log_level, settings.log_format)
    run(settings)
    return 0


if __name__ == "__main__":
    sys.exit(main())
