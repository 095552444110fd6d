"""Fixtures of the sidecar's unit tests (defined in sidecar_support)."""

from tests.unit.sidecar.sidecar_support import clock, make_client

__all__ = ["clock", "make_client"]
