"""The harness's apps that run in real pods, and the command that runs one there.

The pods run the project's image, which holds mqbalance but not the harness: an app is handed to
the pod's interpreter as its source, with :mod:`harness.rocketmq.broker_client` (standard library and
mqbalance's remoting codec only) loaded first under its own name.
"""

from __future__ import annotations

from pathlib import Path

from harness.paths import REPO
from harness.rocketmq import broker_client

CONSUMER_APP = REPO / "harness" / "apps" / "consumer_app.py"
"""The consumer app of the real-pod tests and the nemesis suite."""
LAG_CONSUMER_APP = REPO / "harness" / "apps" / "lag_consumer_app.py"
"""The slow consumer of the lag autoscaling test."""


def pod_app_command(app: Path) -> list[str]:
    """The command of a container that runs ``app`` (a harness file) in the project's image: its
    source as ``python -c``, with ``harness.rocketmq.broker_client`` loaded first (its packages
    empty)."""
    name = broker_client.__name__
    parts = name.split(".")
    modules = [(".".join(parts[: i + 1]), "") for i in range(len(parts) - 1)]
    modules.append((name, Path(broker_client.__file__).read_text()))
    filename = app.relative_to(REPO).as_posix() if app.is_relative_to(REPO) else app.name
    loader = (
        "import sys, types\n"
        "for _name, _source in " + repr(tuple(modules)) + ":\n"
        "    _module = sys.modules[_name] = types.ModuleType(_name)\n"
        "    exec(compile(_source, _name.replace('.', '/') + '.py', 'exec'), _module.__dict__)\n"
        "    _parent, _, _child = _name.rpartition('.')\n"
        "    if _parent:\n"
        "        setattr(sys.modules[_parent], _child, _module)\n"
        "del _name, _source, _module, _parent, _child\n"
        "exec(compile(" + repr(app.read_text()) + ", " + repr(filename) + ", 'exec'))\n"
    )
    return ["python", "-c", loader]
