"""The `remote_rm` reward: POST the sample to a reward-model server at `--rm-url`.

Owns `sample_payload` and `remote_rm`. The request body is a JSON object with the sample's
`prompt`, `response`, `label`, `metadata`, `index` and `group_index`; the server's JSON answer
(a number or an object, read later through `--reward-key`) is the reward. Connection errors,
timeouts and HTTP error statuses are retried with exponential backoff; after the last attempt a
RuntimeError names the URL and the last error.
"""

from __future__ import annotations

import asyncio
import logging

import aiohttp

logger = logging.getLogger(__name__)

DEFAULT_MAX_ATTEMPTS = 5
DEFAULT_BASE_DELAY_S = 1.0
DEFAULT_TIMEOUT_S = 60.0


def sample_payload(sample, response: str | None = None) -> dict:
    """The JSON body sent for `sample`; `response` overrides sample.response (boxed_ types)."""
    return {
        "prompt": sample.prompt,
        "response": sample.response if response is None else response,
        "label": sample.label,
        "metadata": sample.metadata,
        "index": getattr(sample, "index", None),
        "group_index": getattr(sample, "group_index", None),
    }


async def _post_once(url: str, payload: dict, timeout_s: float):
    """One POST; raises aiohttp.ClientError (incl. HTTP >= 400) or asyncio.TimeoutError."""
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        async with session.post(url, json=payload) as resp:
            resp.raise_for_status()
            return await resp.json(content_type=None)


async def remote_rm(
    args,
    sample,
    *,
    response: str | None = None,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    base_delay: float = DEFAULT_BASE_DELAY_S,
    timeout: float = DEFAULT_TIMEOUT_S,
):
    """Score `sample` with the server at `args.rm_url`; returns the decoded JSON reply.

    Attempt k (0-based) that fails is followed by a sleep of `base_delay * 2**k` seconds.
    Raises ValueError without `--rm-url`, RuntimeError after `max_attempts` failures.
    """
    url = args.rm_url
    if not url:
        raise ValueError("rm_type 'remote_rm' needs --rm-url (the reward server's POST endpoint)")
    if max_attempts < 1:
        raise ValueError(f"remote_rm: max_attempts must be >= 1, got {max_attempts}")
    payload = sample_payload(sample, response)
    last_error: BaseException | None = None
    for attempt in range(max_attempts):
        try:
            return await _post_once(url, payload, timeout)
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:  # retried: server may recover
            last_error = exc
        if attempt + 1 < max_attempts:
            delay = base_delay * 2**attempt
            logger.warning(
                "remote_rm %s attempt %d/%d failed (%r); retrying in %.2fs",
                url,
                attempt + 1,
                max_attempts,
                last_error,
                delay,
            )
            await asyncio.sleep(delay)
    raise RuntimeError(
        f"remote reward model at {url} failed after {max_attempts} attempts: {last_error!r}"
    )
