"""A synchronous httpx client that talks to an ASGI app in this process, without a socket.

The app runs on an event loop in a background thread, as it would under uvicorn, so blocking
work it hands to its thread pool behaves as in production.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import httpx


class AsgiClient:
    def __init__(self, app: Any, base_url: str) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=base_url)

    def request(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        future = asyncio.run_coroutine_threadsafe(
            self._client.request(method, url, **kwargs), self._loop
        )
        return future.result(timeout=60)

    def get(self, url: str, **kwargs: Any) -> httpx.Response:
        return self.request("GET", url, **kwargs)

    def post(self, url: str, **kwargs: Any) -> httpx.Response:
        return self.request("POST", url, **kwargs)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._client.aclose(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()
