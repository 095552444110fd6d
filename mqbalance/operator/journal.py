"""The rebalance journal: one JSON line per published generation, for ``mqbalance replay``.

Lines go to their own stream, never mixed with the operator's logs: a file opened
for appending (``--journal PATH``) or standard output, through logger
``mqbalance.journal`` with a bare format so every line is exactly one JSON object.
"""

from __future__ import annotations

import logging
import sys

from mqbalance.journal import JournalRecord

LOGGER_NAME = "mqbalance.journal"


class Journal:
    def __init__(self, path: str | None = None) -> None:
        self.logger = logging.getLogger(LOGGER_NAME)
        self.logger.setLevel(logging.INFO)
        self.logger.propagate = False
        for old in list(self.logger.handlers):
            self.logger.removeHandler(old)
            old.close()
        handler: logging.Handler = (
            logging.FileHandler(path, mode="a", encoding="utf-8")
            if path
            else logging.StreamHandler(sys.stdout)
        )
        handler.setFormatter(logging.Formatter("%(message)s"))
        self.logger.addHandler(handler)
        self.handler = handler

    def write(self, record: JournalRecord) -> None:
        self.logger.info(record.encode())

    def close(self) -> None:
        self.logger.removeHandler(self.handler)
        self.handler.close()
