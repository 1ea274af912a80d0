"""`/generate` requests the router cannot carry go straight to an engine.

sglang-router 0.3.2 re-serialises every `/generate` body through its own request struct, which has
no `return_routed_experts` field (the engines behind it never see the field: the name is absent
from the router's binary, and a request for routed experts through it comes back without them)
and holds one `SamplingParams` per request (a batched body with one dict per prompt is refused,
HTTP 422). The routing-replay rollout (`--use-rollout-routing-replay`) and the batched group
requests (`--rollout-group-requests`, `group_requests.py`) therefore send their requests to the
engines the router lists (`GET /workers`), round robin, and everything else keeps the router.
"""

from __future__ import annotations

import asyncio

import aiohttp

from slime.rollout.client_pool import ClientPool
from slime.utils.engine_client import EngineClient


class NoEngineListed(aiohttp.ClientConnectionError):
    """The router lists no engine (all gone, or one being restarted by `--use-fault-tolerance`):
    a connection failure like a dead engine's, so the fault-tolerant send retries it."""


class DirectEngines:
    """Round-robin clients of the engines registered with a router (listed on first use, and
    again after `forget()`). Concurrent first picks (a rollout's groups all start at once) wait for
    one listing and share its clients: one HTTP session per engine, whose connections the
    requests reuse. With `pool` (`client_pool.ClientPool`) the clients are the pool's, kept
    for later rollouts and left open by `close()`."""

    def __init__(self, router: EngineClient, pool: ClientPool | None = None) -> None:
        self._router = router
        self._pool = pool
        self._clients: list[EngineClient] | None = None
        self._stale: list[EngineClient] = []
        self._next = 0
        self._listing = asyncio.Lock()

    async def pick(self) -> EngineClient:
        """The client of the next engine."""
        async with self._listing:
            if self._clients is None:
                self._clients = await self._list()
            client = self._clients[self._next % len(self._clients)]
            self._next += 1
        return client

    async def _list(self) -> list[EngineClient]:
        body = await self._router.request("GET", "/workers")
        workers = body.get("workers", []) if isinstance(body, dict) else body
        urls = [w["url"] if isinstance(w, dict) else str(w) for w in workers]
        if not urls:
            raise NoEngineListed(f"the router at {self._router.base_url} lists no engines")
        timeout = self._router.timeout.total
        if self._pool is not None:
            return [self._pool.client(url, timeout) for url in urls]
        return [EngineClient(url, timeout=timeout) for url in urls]

    def forget(self) -> None:
        """Drop the engine list: the next `pick` asks the router again (an engine failed and may
        have been replaced at another address). Requests in flight keep their clients until
        `close()`."""
        self._stale += self._clients or []
        self._clients = None

    async def close(self) -> None:
        """Close every engine client opened so far (the pool's stay open)."""
        clients, self._stale, self._clients = self._stale + (self._clients or []), [], None
        if self._pool is None:
            for client in clients:
                await client.close()
