"""remote_rm against a real aiohttp server on 127.0.0.1: payload, retries, final error."""

import asyncio
from types import SimpleNamespace

import pytest
from aiohttp import web

from slime.rollout.rm_hub import async_rm
from slime.utils.types import Sample


class FlakyRewardServer:
    """POST /score answers HTTP 500 for the first `failures` requests, then {"score": ...}."""

    def __init__(self, failures: int):
        self.failures = failures
        self.requests: list[dict] = []

    async def handle(self, request: web.Request) -> web.Response:
        self.requests.append(await request.json())
        if len(self.requests) <= self.failures:
            return web.Response(status=500, text="reward model overloaded")
        payload = self.requests[-1]
        return web.json_response({"score": 1.0 if payload["response"] == payload["label"] else 0.0})


async def score_with_server(server: FlakyRewardServer, sample, rm_type="remote_rm", **kwargs):
    """Start `server` on a free port, run async_rm against it, and always stop the server."""
    app = web.Application()
    app.router.add_post("/score", server.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    args = SimpleNamespace(
        rm_type=rm_type,
        custom_rm_path=None,
        group_rm=False,
        rm_url=f"http://{host}:{port}/score",
        reward_key="score",
    )
    try:
        return await async_rm(args, sample, **kwargs), args.rm_url
    finally:
        await runner.cleanup()


def test_retries_after_server_errors_then_succeeds():
    server = FlakyRewardServer(failures=2)
    sample = Sample(prompt="1+1?", response="2", label="2", index=7, metadata={"src": "gsm8k"})
    reward, _ = asyncio.run(score_with_server(server, sample, max_attempts=4, base_delay=0.01))
    assert reward == {"score": 1.0}
    assert len(server.requests) == 3
    assert server.requests[-1] == {
        "prompt": "1+1?",
        "response": "2",
        "label": "2",
        "metadata": {"src": "gsm8k"},
        "index": 7,
        "group_index": None,
    }


def test_always_failing_server_raises_after_max_attempts_naming_the_url():
    server = FlakyRewardServer(failures=10**6)
    sample = Sample(prompt="p", response="r", label="l")
    with pytest.raises(RuntimeError) as info:
        asyncio.run(score_with_server(server, sample, max_attempts=3, base_delay=0.01))
    assert len(server.requests) == 3
    assert "after 3 attempts" in str(info.value)
    assert "http://127.0.0.1:" in str(info.value) and "/score" in str(info.value)
    assert "500" in str(info.value)


def test_boxed_remote_rm_sends_only_the_boxed_answer():
    server = FlakyRewardServer(failures=0)
    sample = Sample(prompt="p", response=r"Thus \boxed{42}.", label="42")
    reward, _ = asyncio.run(score_with_server(server, sample, rm_type="boxed_remote_rm"))
    assert reward == {"score": 1.0}
    assert server.requests[0]["response"] == "42"


def test_remote_rm_without_url_names_the_flag():
    args = SimpleNamespace(rm_type="remote_rm", custom_rm_path=None, group_rm=False, rm_url=None)
    with pytest.raises(ValueError, match="--rm-url"):
        asyncio.run(async_rm(args, Sample(response="r", label="l")))
