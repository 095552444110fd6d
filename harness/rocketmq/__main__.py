"""``python -m harness.rocketmq up|fetch|capture``: :func:`harness.rocketmq.server.main`."""

import sys

from harness.rocketmq.server import main

sys.exit(main())
