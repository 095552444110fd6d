"""The aiohttp sidecar, and its standard-library client.

This file imports nothing: ``mqbalance.sidecar.client`` (and ``mqbalance drain``) must stay
importable with the standard library only, without the ``sidecar`` extra's aiohttp,
kubernetes and prometheus-client (tests/unit/test_sidecar_client_standalone.py).
"""
