"""Allow ``python -m mqbalance``."""

import sys

from mqbalance.cli import main

sys.exit(main())
