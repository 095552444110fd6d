"""The errors of the local control plane and of kubectl against it."""

from __future__ import annotations

import subprocess


class ClusterError(RuntimeError):
    """The local control plane could not be built, started or reached."""


class KubectlError(subprocess.CalledProcessError):
    """A kubectl call failed; unlike its base class the message includes kubectl's stderr."""

    def __str__(self) -> str:
        return f"{super().__str__()}\nstderr: {(self.stderr or '').strip()}"
