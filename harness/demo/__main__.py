"""``python -m harness.demo``: :func:`harness.demo.standin.main`."""

import sys

from harness.demo.standin import main

sys.exit(main())
