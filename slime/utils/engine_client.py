"""HTTP client for rollout engines: SGLang servers and the local engine speak the same surface.

Owns `EngineClient` (async, aiohttp: one method per endpoint of docs/slime-compat.md section 6),
`SyncEngineClient` (the same methods for scripts, each call in its own event loop),
`EngineHTTPError` and `wait_until_healthy`. Nothing here is specific to one engine; the bodies
come from `slime.utils.engine_requests`. Every request carries the job's key
(`Authorization: Bearer`, from `$SLIME_API_KEY` unless given; see `slime.utils.security`). Only health probes and /flush_cache (400 while requests
drain) retry; every other call is sent once (a retried weight update or generation could apply
twice).
"""

from __future__ import annotations

import asyncio
import logging
import time

import aiohttp

from slime.utils import engine_requests as bodies
from slime.utils.security import auth_headers, job_api_key

logger = logging.getLogger(__name__)

FLUSH_TIMEOUT_S = 120.0  # how long /flush_cache is retried while SGLang answers 400


class EngineHTTPError(RuntimeError):
    """A non-2xx answer from an engine; carries the status and the body text."""

    def __init__(self, url: str, status: int, body: str) -> None:
        super().__init__(f"{url} answered HTTP {status}: {body[:2000]}")
        self.url, self.status, self.body = url, status, body

    def __reduce__(self):  # rebuild from the constructor's arguments (Ray pickles exceptions)
        return type(self), (self.url, self.status, self.body)


class EngineClient:
    """Async client of one engine at `base_url` (e.g. "http://127.0.0.1:30000").

    Use as `async with EngineClient(url) as c: ...` or call `close()`; the aiohttp session is
    created lazily inside the running loop. `api_key` None means the job's (`$SLIME_API_KEY`).
    """

    def __init__(self, base_url: str, timeout: float = 600.0, api_key: str | None = None,
                 keepalive_timeout: float | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = aiohttp.ClientTimeout(total=timeout)
        self.headers = auth_headers(api_key or job_api_key())
        self.keepalive_timeout = keepalive_timeout  # idle connections kept this long (None: aiohttp's default)
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> "EngineClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the HTTP session."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _sess(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = (None if self.keepalive_timeout is None
                         else aiohttp.TCPConnector(keepalive_timeout=self.keepalive_timeout))
            self._session = aiohttp.ClientSession(timeout=self.timeout, headers=self.headers, connector=connector)
        return self._session

    async def request(self, method: str, path: str, payload: dict | None = None):
        """Send one request; returns the decoded JSON (or text) body, raises `EngineHTTPError` on non-2xx."""
        url = f"{self.base_url}{path}"
        async with self._sess().request(method, url, json=payload) as resp:
            text = await resp.text()
            if resp.status >= 300:
                raise EngineHTTPError(url, resp.status, text)
            if resp.content_type == "application/json":
                return await resp.json()
            return text

    async def generate(self, payload: dict):
        """POST /generate; returns the response dict (a list for batched input).

        Build `payload` with `engine_requests.generate` (SGLang's `GenerateReqInput` fields)."""
        return await self.request("POST", "/generate", payload)

    async def health(self, retries: int = 0, interval: float = 1.0) -> bool:
        """True if GET /health answers 200 (within `retries` extra attempts)."""
        for attempt in range(retries + 1):
            try:
                await self.request("GET", "/health")
                return True
            except (aiohttp.ClientError, asyncio.TimeoutError, EngineHTTPError) as exc:
                logger.debug("health probe %d of %s failed: %s", attempt, self.base_url, exc)
                if attempt < retries:
                    await asyncio.sleep(interval)
        return False

    async def health_generate(self):
        """GET /health_generate (the engine generates one token)."""
        return await self.request("GET", "/health_generate")

    async def flush_cache(self, timeout: float = FLUSH_TIMEOUT_S, interval: float = 0.1,
                          max_interval: float = 2.0):
        """GET /flush_cache until it answers 200.

        SGLang answers 400 while requests are in flight (e.g. aborted ones still draining after
        /pause_generation), so a 400 is retried with exponential backoff (`interval` doubling up to
        `max_interval`) for up to `timeout` seconds; then `EngineHTTPError` (status 400) says how
        many attempts failed and what the engine last answered. Other errors are raised at once."""
        loop = asyncio.get_running_loop()
        deadline, attempt = loop.time() + timeout, 0
        while True:
            attempt += 1
            try:
                return await self.request("GET", "/flush_cache")
            except EngineHTTPError as exc:
                if exc.status != 400:
                    raise
                if loop.time() + interval > deadline:
                    raise EngineHTTPError(exc.url, exc.status, f"cache not flushed after {attempt} attempt(s) "
                                          f"in {timeout:.0f}s (requests still in flight?); last answer: {exc.body}"
                                          ) from exc
                logger.info("%s: flush_cache answered 400 (attempt %d), retrying in %.1fs", self.base_url,
                            attempt, interval)
                await asyncio.sleep(interval)
                interval = min(2 * interval, max_interval)

    async def pause_generation(self, mode: str = "abort"):
        """POST /pause_generation (SGLang's `mode`: "abort" finishes requests in flight, "retract",
        "in_place"; see `engine_requests.pause_generation`)."""
        return await self.request("POST", "/pause_generation", bodies.pause_generation(mode))

    async def continue_generation(self):
        """POST /continue_generation."""
        return await self.request("POST", "/continue_generation", bodies.continue_generation())

    async def abort_request(self, rid: str | None = None, abort_all: bool = False):
        """POST /abort_request for one rid or every request."""
        return await self.request("POST", "/abort_request", bodies.abort_request(rid, abort_all))

    async def get_model_info(self) -> dict:
        """GET /model_info (SGLang's name since 0.5.x; /get_model_info is deprecated)."""
        return await self.request("GET", "/model_info")

    async def get_server_info(self) -> dict:
        """GET /server_info (server args, e.g. tp_size, plus live state)."""
        return await self.request("GET", "/server_info")

    async def get_weight_version(self) -> str:
        """The engine's weight version, from GET /model_info (SGLang serves no /get_weight_version)."""
        return (await self.get_model_info())["weight_version"]

    async def init_weights_update_group(self, master_address: str, master_port: int, rank_offset: int,
                                        world_size: int, group_name: str, backend: str = "nccl"):
        """POST /init_weights_update_group (returns once the engine joined; run the trainer's join concurrently)."""
        return await self.request("POST", "/init_weights_update_group", bodies.init_weights_update_group(
            master_address, master_port, rank_offset, world_size, group_name, backend))

    async def update_weights_from_distributed(self, names: list[str], dtypes: list[str], shapes: list[list[int]],
                                              group_name: str, flush_cache: bool = False,
                                              weight_version: str | None = None, load_format: str | None = None):
        """POST /update_weights_from_distributed (broadcast the tensors from rank 0 concurrently:
        one per tensor, or with `load_format` "flattened_bucket" one of their bytes in `names`
        order, each tensor starting where the previous one ends)."""
        return await self.request("POST", "/update_weights_from_distributed", bodies.update_weights_from_distributed(
            names, dtypes, shapes, group_name, flush_cache, weight_version, load_format))

    async def destroy_weights_update_group(self, group_name: str):
        """POST /destroy_weights_update_group."""
        return await self.request("POST", "/destroy_weights_update_group",
                                  bodies.destroy_weights_update_group(group_name))

    async def update_weights_from_tensor(self, serialized_named_tensors: list[str], load_format: str | None = None,
                                         flush_cache: bool = False, weight_version: str | None = None):
        """POST /update_weights_from_tensor (one serialized entry per engine TP rank)."""
        return await self.request("POST", "/update_weights_from_tensor", bodies.update_weights_from_tensor(
            serialized_named_tensors, load_format, flush_cache, weight_version))

    async def begin_weight_update(self):
        """POST /begin_weight_update: open the session SGLang 0.5.23 needs around tensor and
        distributed updates (see `slime.utils.engine_protocol`; 0.5.15.post1 has no such endpoint)."""
        return await self.request("POST", "/begin_weight_update", bodies.begin_weight_update())

    async def end_weight_update(self):
        """POST /end_weight_update: close the session (SGLang then finalises the loaded weights)."""
        return await self.request("POST", "/end_weight_update", bodies.end_weight_update())

    async def update_weights_from_disk(self, model_path: str, load_format: str | None = None,
                                       weight_version: str | None = None):
        """POST /update_weights_from_disk."""
        return await self.request("POST", "/update_weights_from_disk",
                                  bodies.update_weights_from_disk(model_path, load_format, weight_version))

    async def release_memory_occupation(self, tags: list[str] | None = None):
        """POST /release_memory_occupation."""
        return await self.request("POST", "/release_memory_occupation", bodies.release_memory_occupation(tags))

    async def resume_memory_occupation(self, tags: list[str] | None = None):
        """POST /resume_memory_occupation (tags e.g. ["weights", "kv_cache"]; None = all)."""
        return await self.request("POST", "/resume_memory_occupation", bodies.resume_memory_occupation(tags))


class SyncEngineClient:
    """Blocking twin of `EngineClient` for scripts: `SyncEngineClient(url).generate({...})`.

    Every public coroutine method of `EngineClient` is available with the same arguments; each
    call runs in a fresh event loop with a fresh session (do not use inside a running loop).
    """

    def __init__(self, base_url: str, timeout: float = 600.0, api_key: str | None = None) -> None:
        self.base_url, self.timeout, self.api_key = base_url, timeout, api_key

    def __getattr__(self, name: str):
        method = getattr(EngineClient, name, None)
        if name.startswith("_") or not asyncio.iscoroutinefunction(method):
            raise AttributeError(name)

        def call(*args, **kwargs):
            async def once():
                async with EngineClient(self.base_url, self.timeout, self.api_key) as client:
                    return await getattr(client, name)(*args, **kwargs)

            return asyncio.run(once())

        call.__doc__ = method.__doc__
        return call


def run_with_client(base_url: str, call, timeout: float = 600.0, api_key: str | None = None):
    """Blocking: `await call(client)` with a fresh `EngineClient` of `base_url` in a fresh loop
    (for sequences of calls, e.g. `engine_protocol.release_memory`; not inside a running loop)."""
    async def once():
        async with EngineClient(base_url, timeout, api_key) as client:
            return await call(client)

    return asyncio.run(once())


def wait_until_healthy(base_url: str, timeout: float = 300.0, process=None, interval: float = 0.1) -> None:
    """Block until GET {base_url}/health answers 200.

    Raises RuntimeError at once (with the exit code) if `process` (a `subprocess.Popen`) died,
    TimeoutError after `timeout` seconds.
    """
    import requests

    deadline = time.monotonic() + timeout
    while True:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"engine process {process.pid} for {base_url} exited with code {process.returncode}")
        try:
            if requests.get(f"{base_url.rstrip('/')}/health", timeout=5).status_code == 200:
                return
        except requests.RequestException as exc:  # not up yet
            logger.debug("waiting for %s: %s", base_url, exc)
        if time.monotonic() > deadline:
            raise TimeoutError(f"engine at {base_url} not healthy after {timeout:.0f}s")
        time.sleep(interval)
