"""Faults and how the tests score them: partitions and kills on real nodes (``netfault``), a proxy a
test can cut (``tcp_proxy``), a hostile NameServer (``hostile_nameserver``) and the nemesis suite's
scoring, messages and replay (``nemesis``, ``nemesis_mq``, ``nemesis_replay``)."""
