"""``python -m harness.node up|down|check``: :func:`harness.node.cluster.main`."""

import sys

from harness.node.cluster import main

sys.exit(main())
