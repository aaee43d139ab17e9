"""Everything on one machine: a private embedded Valkey and ``airt up``.

Layer: above :mod:`airuntime.control_plane`; used by the CLI.
"""
