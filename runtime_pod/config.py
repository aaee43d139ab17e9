"""Compatibility: the settings of a runtime instance live in
:mod:`airuntime.fleet.instance_settings` (the operator derives a pod's environment
from them and must not import this package)."""

from airuntime.fleet.instance_settings import InstanceConfig, InstanceSettings

__all__ = ["InstanceConfig", "InstanceSettings"]
