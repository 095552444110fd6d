"""Run the operator with one mutant of ``tests/mutation/mutants.py`` applied.

    python -m tests.mutation.operator_mutant MUTANT -- OPERATOR-ARGS...

is ``mqbalance operator OPERATOR-ARGS...`` (the same ``main``, arguments and exit status) with
MUTANT's monkeypatches in place first. ``harness.apps.operator.OperatorProcess`` runs this instead of
the product when ``$MQBALANCE_TEST_MUTANT`` names a mutant.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from tests.mutation.mutants import MUTANTS


def main(argv: Sequence[str]) -> int:
    args = list(argv)
    if len(args) < 2 or args[1] != "--" or args[0] not in MUTANTS:
        names = ", ".join(MUTANTS)
        print(
            f"usage: python -m tests.mutation.operator_mutant MUTANT -- OPERATOR-ARGS...\n"
            f"MUTANT: one of {names} (got {args[:1]})",
            file=sys.stderr,
        )
        return 2
    mutant = MUTANTS[args[0]]
    mutant.apply()
    print(f"MUTANT {mutant.name} applied: {mutant.breaks}", file=sys.stderr, flush=True)
    from mqbalance.operator.main import main as operator_main

    return operator_main(args[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
