"""How the harness runs the product: ``mqbalance`` command lines and the environment of a process
run against a cluster from outside it."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Protocol


class HasEnv(Protocol):
    """A cluster, as far as a process run against it cares: the environment that reaches it."""

    @property
    def env(self) -> Mapping[str, str]: ...


def mqbalance_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "mqbalance", *args]


MUTANT_ENV = "MQBALANCE_TEST_MUTANT"
"""Names a deliberately broken operator of ``tests/mutation`` for
:class:`~harness.apps.operator.OperatorProcess` to run instead of the product (docs/reliability.md,
"Mutation runs"); unset in every ordinary run."""


def operator_argv(*args: str) -> list[str]:
    """``mqbalance operator ARGS``; with ``$MQBALANCE_TEST_MUTANT`` set, the same operator with that
    mutant of ``tests/mutation/mutants.py`` applied first."""
    mutant = os.environ.get(MUTANT_ENV)
    if mutant:
        return [sys.executable, "-m", "tests.mutation.operator_mutant", mutant, "--", *args]
    return mqbalance_argv("operator", *args)


def cluster_env(cluster: HasEnv, **extra: str) -> dict[str, str]:
    """The environment of a process run against ``cluster`` from outside it."""
    env = {**cluster.env, "PYTHONUNBUFFERED": "1", **extra}
    env.pop("KUBERNETES_SERVICE_HOST", None)  # never take the in-cluster path by accident
    return env
