"""slime's `http_utils` import path: `post` and `get` for plugins that call engines or the router.

Both are async, send the job's key (`Authorization: Bearer`, as `EngineClient` does: they are
`EngineClient.request` on the whole URL) and return the decoded JSON (or text) body. A request
that cannot reach the server (connection refused or reset, timeout) is retried up to
`max_retries` times, `RETRY_INTERVAL_S` apart; an HTTP error status is raised at once as
`EngineHTTPError` (a server that answered may have applied the request).
"""

from __future__ import annotations

import asyncio
import logging

import aiohttp

from slime.utils.engine_client import EngineClient

logger = logging.getLogger(__name__)

RETRY_INTERVAL_S = 1.0


async def _send(method: str, url: str, payload: dict | None, max_retries: int):
    if max_retries < 0:
        raise ValueError(f"max_retries must be >= 0, got {max_retries}")
    for attempt in range(max_retries + 1):
        try:
            async with EngineClient(url) as client:
                return await client.request(method, "", payload)
        except (aiohttp.ClientConnectionError, asyncio.TimeoutError) as exc:
            if attempt == max_retries:
                raise
            logger.warning("%s %s failed (%s); retry %d of %d", method, url, exc, attempt + 1, max_retries)
            await asyncio.sleep(RETRY_INTERVAL_S)


async def post(url: str, payload: dict | None, max_retries: int = 60, action: str = "post"):
    """Send `payload` as JSON with HTTP method `action` (post, put, ...) to `url`; the body."""
    return await _send(action.upper(), url, payload, max_retries)


async def get(url: str, max_retries: int = 60):
    """GET `url`; the body."""
    return await _send("GET", url, None, max_retries)
