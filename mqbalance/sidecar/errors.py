"""The sidecar API's error answer: ``{"error": "...", "status": N}``."""

from __future__ import annotations

from aiohttp import web


class ApiError(Exception):
    """An answer other than success, with the message the client sees."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": message, "status": status}, status=status, headers=headers)
