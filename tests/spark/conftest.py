"""The Spark tests need pyspark; their ``spark`` fixture (one local[2] session for the whole test
session, shared with the integration tests that replay the operator's journal) is in tests/conftest.py."""

from __future__ import annotations

import pytest

pyspark = pytest.importorskip("pyspark", reason="the Spark tests need the 'replay' extra")
