"""The ``mqbalance`` command: one entry point, a sub-command per part.

Each sub-command's module is imported only when it runs, so ``mqbalance allocate``
never pays for importing kopf or pyspark.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

# sub-command -> (module with a ``main(argv) -> int``, one-line summary)
COMMANDS: dict[str, tuple[str, str]] = {
    "allocate": ("mqbalance.allocate_cli", "compute an assignment from a JSON request (dry run)"),
    "operator": ("mqbalance.operator.main", "run the Kubernetes operator"),
    "sidecar": ("mqbalance.sidecar.main", "run the per-pod assignment and producer sidecar"),
    "drain": (
        "mqbalance.sidecar.drain",
        "wait until this pod's sidecar has nothing left to hand over (preStop)",
    ),
    "replay": ("mqbalance.pipeline.main", "replay rebalance history through every strategy (PySpark)"),
}


def usage() -> str:
    width = max(len(name) for name in COMMANDS)
    lines = ["usage: mqbalance COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name.ljust(width)}  {summary}" for name, (_, summary) in COMMANDS.items()]
    lines += ["", "Run 'mqbalance COMMAND --help' for a command's options."]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    if args[0] in ("-V", "--version"):
        from mqbalance import __version__

        print(f"mqbalance {__version__}")
        return 0
    command = COMMANDS.get(args[0])
    if command is None:
        print(f"mqbalance: unknown command {args[0]!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(command[0])
    result: int = module.main(args[1:])
    return result


if __name__ == "__main__":
    sys.exit(main())
