"""HTTP client for rollout engines: SGLang servers and the local engine speak the same surface.

Owns `EngineClient` (async, aiohttp: one method per endpoint of docs/slime-compat.md section 6),
`SyncEngineClient` (the same methods for scripts, each call in its own event loop),
`EngineHTTPError` and `wait_until_healthy`. Nothing here is specific to one engine. Only health
probes retry; every other call is sent once (a retried weight update or generation could apply
twice).
"""

from __future__ import annotations

import asyncio
import logging
import time

import aiohttp

logger = logging.getLogger(__name__)


class EngineHTTPError(RuntimeError):
    """A non-2xx answer from an engine; carries the status and the body text."""

    def __init__(self, url: str, status: int, body: str) -> None:
        super().__init__(f"{url} answered HTTP {status}: {body[:2000]}")
        self.url, self.status, self.body = url, status, body


class EngineClient:
    """Async client of one engine at `base_url` (e.g. "http://127.0.0.1:30000").

    Use as `async with EngineClient(url) as c: ...` or call `close()`; the aiohttp session is
    created lazily inside the running loop.
    """

    def __init__(self, base_url: str, timeout: float = 600.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = aiohttp.ClientTimeout(total=timeout)
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
            self._session = aiohttp.ClientSession(timeout=self.timeout)
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
        """POST /generate; returns the response dict (a list for batched input)."""
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

    async def flush_cache(self):
        """GET /flush_cache."""
        return await self.request("GET", "/flush_cache")

    async def pause_generation(self, mode: str | None = None):
        """POST /pause_generation; SGLang's `mode` ("abort", "retract", "in_place") when given."""
        return await self.request("POST", "/pause_generation", {} if mode is None else {"mode": mode})

    async def continue_generation(self):
        """POST /continue_generation."""
        return await self.request("POST", "/continue_generation", {})

    async def abort_request(self, rid: str | None = None, abort_all: bool = False):
        """POST /abort_request for one rid or every request."""
        if rid is None and not abort_all:
            raise ValueError("abort_request needs rid or abort_all=True")
        payload = {"abort_all": True} if abort_all else {"rid": rid}
        return await self.request("POST", "/abort_request", payload)

    async def get_model_info(self) -> dict:
        """GET /get_model_info."""
        return await self.request("GET", "/get_model_info")

    async def get_server_info(self) -> dict:
        """GET /get_server_info."""
        return await self.request("GET", "/get_server_info")

    async def get_weight_version(self) -> str:
        """GET /get_weight_version -> the version string."""
        return (await self.request("GET", "/get_weight_version"))["weight_version"]

    async def init_weights_update_group(self, master_address: str, master_port: int, rank_offset: int,
                                        world_size: int, group_name: str, backend: str = "nccl"):
        """POST /init_weights_update_group (returns once the engine joined; run the trainer's join concurrently)."""
        return await self.request("POST", "/init_weights_update_group", {
            "master_address": master_address, "master_port": master_port, "rank_offset": rank_offset,
            "world_size": world_size, "group_name": group_name, "backend": backend})

    async def update_weights_from_distributed(self, names: list[str], dtypes: list[str], shapes: list[list[int]],
                                              group_name: str, flush_cache: bool = False,
                                              weight_version: str | None = None):
        """POST /update_weights_from_distributed (broadcast the tensors from rank 0 concurrently)."""
        return await self.request("POST", "/update_weights_from_distributed", {
            "names": names, "dtypes": dtypes, "shapes": shapes, "group_name": group_name,
            "flush_cache": flush_cache, "weight_version": weight_version})

    async def destroy_weights_update_group(self, group_name: str):
        """POST /destroy_weights_update_group."""
        return await self.request("POST", "/destroy_weights_update_group", {"group_name": group_name})

    async def update_weights_from_tensor(self, serialized_named_tensors: list[str], load_format: str | None = None,
                                         flush_cache: bool = False, weight_version: str | None = None):
        """POST /update_weights_from_tensor (one serialized entry per engine TP rank)."""
        return await self.request("POST", "/update_weights_from_tensor", {
            "serialized_named_tensors": serialized_named_tensors, "load_format": load_format,
            "flush_cache": flush_cache, "weight_version": weight_version})

    async def update_weights_from_disk(self, model_path: str, load_format: str | None = None,
                                       weight_version: str | None = None):
        """POST /update_weights_from_disk."""
        return await self.request("POST", "/update_weights_from_disk", {
            "model_path": model_path, "load_format": load_format, "weight_version": weight_version})

    async def release_memory_occupation(self, tags: list[str] | None = None):
        """POST /release_memory_occupation."""
        return await self.request("POST", "/release_memory_occupation", {} if tags is None else {"tags": tags})

    async def resume_memory_occupation(self, tags: list[str] | None = None):
        """POST /resume_memory_occupation (tags e.g. ["weights", "kv_cache"]; None = all)."""
        return await self.request("POST", "/resume_memory_occupation", {} if tags is None else {"tags": tags})


class SyncEngineClient:
    """Blocking twin of `EngineClient` for scripts: `SyncEngineClient(url).generate({...})`.

    Every public coroutine method of `EngineClient` is available with the same arguments; each
    call runs in a fresh event loop with a fresh session (do not use inside a running loop).
    """

    def __init__(self, base_url: str, timeout: float = 600.0) -> None:
        self.base_url, self.timeout = base_url, timeout

    def __getattr__(self, name: str):
        method = getattr(EngineClient, name, None)
        if name.startswith("_") or not asyncio.iscoroutinefunction(method):
            raise AttributeError(name)

        def call(*args, **kwargs):
            async def once():
                async with EngineClient(self.base_url, self.timeout) as client:
                    return await getattr(client, name)(*args, **kwargs)

            return asyncio.run(once())

        call.__doc__ = method.__doc__
        return call


def wait_until_healthy(base_url: str, timeout: float = 300.0, process=None, interval: float = 0.5) -> None:
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
