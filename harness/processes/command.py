"""The harness's command lines (``python -m harness.kube.cluster up``, ``python -m harness.node up``,
...): a subcommand run with its expected errors printed, and an ``up`` that serves until Ctrl-C."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence

ErrorTypes = type[Exception] | tuple[type[Exception], ...]


def run_command(parser: argparse.ArgumentParser, argv: Sequence[str] | None, errors: ErrorTypes) -> int:
    """A harness command line: the subcommand ``parser`` picks (``args.func``) run, the ``errors``
    it expects printed as ``error: ...`` with exit code 1."""
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except errors as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def stop_on_ctrl_c() -> None:
    """An ``up`` command is stopped with Ctrl-C, even when started with SIGINT ignored (a
    background job of a non-interactive shell)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)


def serve_until_interrupted(
    export: str, running: Callable[[], bool], logs: Callable[[], str], hint: str = ""
) -> int:
    """An ``up`` command's last step: print ``export`` (for ``eval``), then run until Ctrl-C (0) or
    until ``running`` turns false (1, ``logs()`` printed)."""
    print(export, flush=True)
    print(f"# press Ctrl-C to stop{hint}", file=sys.stderr, flush=True)
    try:
        while running():
            time.sleep(1)
    except KeyboardInterrupt:
        print("\n# stopping", file=sys.stderr)
        return 0
    print(f"a component exited unexpectedly:\n{logs()}", file=sys.stderr)
    return 1
