"""A real RocketMQ for the tests: its releases and jars, the servers (``server``: NameServer and
Brokers, ``python -m harness.rocketmq``), ACL, a RocketMQ driven over stdin (``control``), the
harness's own blocking broker connection (``broker_client``) and the codec's fixtures (``capture``)."""
