"""The rebalance journal: one JSON line per published generation, for ``mqbalance replay``.

Lines go to their own stream, never mixed with the operator's logs: a file opened
for appending (``--journal PATH``) or standard output, through logger
``mqbalance.journal`` with a bare format so every line is exactly one JSON object.
"""

from __future__ import annotations

import logging
import os
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
        if path:
            _drop_torn_record(path)
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


def _drop_torn_record(path: str) -> None:
    """Cut an unterminated last line off the file before appending to it.

    A process killed inside ``write`` leaves part of a record behind (the kernel stops a
    write at a page boundary when a fatal signal is pending); appending after it would
    glue the next record to the torn one. The torn record was never complete, so it goes.
    """
    try:
        with open(path, "rb+") as f:
            size = f.seek(0, os.SEEK_END)
            if size == 0:
                return
            f.seek(size - 1)
            if f.read(1) == b"\n":
                return
            keep = size
            while keep > 0:
                start = max(0, keep - 65536)
                f.seek(start)
                chunk = f.read(keep - start)
                newline = chunk.rfind(b"\n")
                if newline >= 0:
                    keep = start + newline + 1
                    break
                keep = start
            f.truncate(keep)
    except FileNotFoundError:
        return
    logging.getLogger(__name__).warning(
        "journal %s ended in a torn record (%d bytes); dropped it before appending", path, size - keep
    )
