"""``python -m airuntime_operator``: run the operator with settings from the environment.

Peering named ``airuntime`` (HA) unless ``AIRUNTIME_OPERATOR_STANDALONE=1``; see
:class:`~airuntime_operator.settings.OperatorSettings` for every variable.
"""

from __future__ import annotations

import logging
import sys

from airuntime_operator.runner import run
from airuntime_operator.settings import OperatorSettings, SettingsError


def main() -> int:
    try:
        settings = OperatorSettings.from_env()
    except SettingsError as exc:
        print(f"airuntime operator: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=settings.log_level, format="%(asctime)s %(name)s [%(levelname)s] %(message)s"
    )
    run(settings)
    return 0


if __name__ == "__main__":
    sys.exit(main())
