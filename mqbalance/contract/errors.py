"""The error every reader of the contract raises."""

from __future__ import annotations


class SpecError(ValueError):
    """A resource (or journal line, or request) that cannot be honoured; the message names the field
    and says how to fix it."""
