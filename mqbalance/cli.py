"""The ``mqbalance`` command: one entry point, a sub-command per part.

Each sub-command's module is imported only when it runs, so ``mqbalance allocate``
never pays for importing kopf or pyspark, and works in an installation without extras.
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
    "injector": (
        "mqbalance.injector.main",
        "run the admission webhook that adds the sidecar to pods that ask for it",
    ),
    "replay": ("mqbalance.pipeline.main", "replay rebalance history through every strategy (PySpark)"),
}

# sub-command -> the extra that installs its dependencies (pyproject.toml); the others need
# the standard library only.
EXTRAS: dict[str, str] = {
    "operator": "operator",
    "sidecar": "sidecar",
    "injector": "injector",
    "replay": "replay",
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
        from mqbalance import buildinfo

        info = buildinfo.labels("cli")
        print(f"mqbalance {info['version']} ({info['python_implementation']} {info['python_version']})")
        return 0
    command = COMMANDS.get(args[0])
    if command is None:
        print(f"mqbalance: unknown command {args[0]!r}\n\n{usage()}", file=sys.stderr)
        return 2
    try:
        module = importlib.import_module(command[0])
    except ModuleNotFoundError as exc:
        extra = EXTRAS.get(args[0])
        if extra is None or not exc.name or exc.name.split(".")[0] == "mqbalance":
            raise
        print(
            f"mqbalance {args[0]}: needs {exc.name}, which is not installed; "
            f"install it with: pip install 'mqbalance[{extra}]'",
            file=sys.stderr,
        )
        return 2
    result: int = module.main(args[1:])
    return result


if __name__ == "__main__":
    sys.exit(main())
