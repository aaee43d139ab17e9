"""Fixtures of the tenancy suite: the control-plane suite's ``cp``."""

from tests.control_plane.conftest import cp

__all__ = ["cp"]
