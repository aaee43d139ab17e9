"""``python -m airuntime.cli``: the same as ``airt``."""

from airuntime.cli.app import main

main()
