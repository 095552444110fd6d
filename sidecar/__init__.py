"""The aiohttp sidecar."""
