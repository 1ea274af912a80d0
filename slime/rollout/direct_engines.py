"""`/generate` requests the router cannot carry go straight to an engine.

sglang-router 0.3.2 re-serialises every `/generate` body through its own request struct, which has
no `return_routed_experts` field: the engines behind it never see the field (the name is absent
from the router's binary, and a request for routed experts through it comes back without them).
The routing-replay rollout (`--use-rollout-routing-replay`) therefore sends its requests to the
engines the router lists (`GET /workers`), round robin, and everything else keeps the router.
"""

from __future__ import annotations

from slime.utils.engine_client import EngineClient


class DirectEngines:
    """Round-robin clients of the engines registered with a router (listed on first use)."""

    def __init__(self, router: EngineClient) -> None:
        self._router = router
        self._clients: list[EngineClient] | None = None
        self._next = 0

    async def pick(self) -> EngineClient:
        """The client of the next engine."""
        if self._clients is None:
            body = await self._router.request("GET", "/workers")
            workers = body.get("workers", []) if isinstance(body, dict) else body
            urls = [w["url"] if isinstance(w, dict) else str(w) for w in workers]
            if not urls:
                raise RuntimeError(f"the router at {self._router.base_url} lists no engines")
            timeout = self._router.timeout.total
            self._clients = [EngineClient(url, timeout=timeout) for url in urls]
        client = self._clients[self._next % len(self._clients)]
        self._next += 1
        return client

    async def close(self) -> None:
        """Close every engine client opened so far."""
        for client in self._clients or []:
            await client.close()
