"""`ClientPool`: the job's HTTP clients of the router and the engines, kept across rollout calls.

A rollout call used to open a session per server and close it when done, so each rollout paid a
new TCP connection per concurrent request (32 for the 32 groups of the main job's batch) on the
manager's and the engine's side, and the router's listing on a fresh one. The default rollout runs
on the process's background event loop (`slime.utils.async_utils.run`), where sessions can
outlive a call: `GenerateState.client_pool()` hands the rollout this pool there (None on any
other loop: a custom rollout's own loop keeps per-call clients, closed with the call).

Idle connections are dropped after `KEEPALIVE_S`, before the servers' own keep-alive ends them
(uvicorn's, SGLang's server, 5 s): a connection the server is closing is never picked for a
request (aiohttp sends a POST on a pooled connection once, without retrying it). The pool is
closed by `shutdown()` (the rollout manager's end), else when the process exits.
"""

from __future__ import annotations

import atexit
import logging

from slime.utils.async_utils import run
from slime.utils.engine_client import EngineClient

logger = logging.getLogger(__name__)

KEEPALIVE_S = 2.0
CLOSE_TIMEOUT_S = 5.0


class ClientPool:
    """One `EngineClient` per (URL, timeout), made on first use. Create it on the background
    loop; `shutdown()` closes every client there (registered to run at the process's exit too)."""

    def __init__(self) -> None:
        self._clients: dict[tuple[str, float], EngineClient] = {}
        atexit.register(self.shutdown)

    def client(self, url: str, timeout: float) -> EngineClient:
        """The pool's client of `url` (requests time out after `timeout` seconds)."""
        key = (url.rstrip("/"), float(timeout))
        if key not in self._clients:
            self._clients[key] = EngineClient(url, timeout=timeout, keepalive_timeout=KEEPALIVE_S)
        return self._clients[key]

    async def close(self) -> None:
        """Close every client (their sessions and connections), on the loop that used them."""
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            await client.close()

    def shutdown(self) -> None:
        """`close()` on the background loop, from any other thread (waits up to CLOSE_TIMEOUT_S)."""
        atexit.unregister(self.shutdown)
        if not self._clients:
            return
        try:
            run(self.close(), timeout=CLOSE_TIMEOUT_S)
        except TimeoutError:
            logger.warning("the rollout's HTTP clients did not close within %.0f s", CLOSE_TIMEOUT_S)
