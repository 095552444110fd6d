"""The local demo (``make demo``, ``python -m harness.demo``): on a stand-in cluster (``standin``) or on
real pods (``node``), what both share (``common``) and the tables they print (``report``)."""
