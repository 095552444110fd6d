"""What this installation of mqbalance is: its version and the Python running it.

Standard library only: ``mqbalance --version`` works without any extra installed.
"""

from __future__ import annotations

import platform
from importlib import metadata

DISTRIBUTION = "mqbalance"


def version() -> str:
    """The installed ``mqbalance`` distribution's version; the package's own ``__version__`` when it is
    not installed as a distribution (a source tree on ``PYTHONPATH``)."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        from mqbalance import __version__

        return __version__


def labels(component: str) -> dict[str, str]:
    """The labels of ``mqbalance_build_info`` for ``component`` (``operator`` or ``sidecar``)."""
    return {
        "component": component,
        "version": version(),
        "python_version": platform.python_version(),
        "python_implementation": platform.python_implementation(),
    }
