"""Requests from the rollout to sglang-router: the router's address and client, and the
fault-tolerant `/generate` send (`--use-fault-tolerance` re-sends a request whose engine died;
`send_with_retries` is the same rule for any send, e.g. a group's batch to an engine).

Split out of `slime.rollout.sglang_rollout`, which re-exports the public names.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable

import aiohttp

from slime.rollout.client_pool import ClientPool
from slime.utils.engine_client import EngineClient, EngineHTTPError

logger = logging.getLogger(__name__)


# sglang-router's own request timeout when --router-request-timeout-secs is not given.
ROUTER_DEFAULT_REQUEST_TIMEOUT_S = 1800


def router_client(args, pool: ClientPool | None = None) -> EngineClient:
    """The rollout's client of the router (`pool`'s when given); it waits as long as the router
    does for an engine's answer (--router-request-timeout-secs, else the router's default)."""
    timeout = float(getattr(args, "router_request_timeout_secs", None) or ROUTER_DEFAULT_REQUEST_TIMEOUT_S)
    if pool is not None:
        return pool.client(router_url(args), timeout)
    return EngineClient(router_url(args), timeout=timeout)


def router_url(args) -> str:
    if not args.sglang_router_ip or not args.sglang_router_port:
        raise ValueError("no router address: --sglang-router-ip/--sglang-router-port are unset")
    return f"http://{args.sglang_router_ip}:{args.sglang_router_port}"


# With --use-fault-tolerance a /generate whose engine died is re-sent this many times in all,
# waiting FT_RETRY_BACKOFF_S * 2**k (capped) between attempts while the manager restarts the engine.
FT_MAX_ATTEMPTS = 8
FT_RETRY_BACKOFF_S = 0.5
FT_RETRY_BACKOFF_MAX_S = 8.0


def _retryable(exc: BaseException) -> bool:
    """Connection failures, timeouts and 5xx answers (a dead engine behind the router)."""
    if isinstance(exc, EngineHTTPError):
        return exc.status >= 500
    return isinstance(exc, (aiohttp.ClientError, asyncio.TimeoutError))


async def send_generate(args, client: EngineClient, payload: dict) -> dict:
    """POST /generate once, or with `--use-fault-tolerance` up to FT_MAX_ATTEMPTS times on
    retryable failures (the request is re-sent whole: no partial output was kept)."""
    return await send_with_retries(args, lambda: client.generate(payload))


async def send_with_retries(args, send: Callable[[], Awaitable], on_retry: Callable[[], None] | None = None):
    """`await send()` once, or with `--use-fault-tolerance` up to FT_MAX_ATTEMPTS times while it
    fails in a retryable way (connection errors, timeouts, 5xx; exponential backoff between
    attempts). `on_retry()` runs before each new attempt (e.g. to forget a dead engine's address)."""
    attempts = FT_MAX_ATTEMPTS if getattr(args, "use_fault_tolerance", False) else 1
    attempt = 1
    while True:
        try:
            return await send()
        except (EngineHTTPError, aiohttp.ClientError, asyncio.TimeoutError) as exc:
            if attempt >= attempts or not _retryable(exc):
                raise
            delay = min(FT_RETRY_BACKOFF_S * 2 ** (attempt - 1), FT_RETRY_BACKOFF_MAX_S)
            logger.warning("generate failed (attempt %d of %d): %s; retrying in %.1fs", attempt, attempts, exc, delay)
            await asyncio.sleep(delay)
            if on_retry is not None:
                on_retry()
            attempt += 1
