"""EngineClient against a small aiohttp test server: /flush_cache is retried while it answers 400
(SGLang's answer while requests drain) and gives up with a clear error; the exceptions that cross
Ray survive pickling with their message and fields."""

import asyncio
import pickle

import pytest
from aiohttp import web

from slime.backends.local_engine.sampling import RequestError
from slime.backends.sglang_utils.router import RouterError
from slime.ray.actor_group import TrainerRankError
from slime.rollout.rm_hub.latex_sympy import LatexParseError
from slime.utils.arguments.common import ArgumentError
from slime.utils.engine_client import EngineClient, EngineHTTPError


async def _serve_flush(answers: list[int]):
    """A server whose /flush_cache answers the given statuses in turn (the last one repeats)."""
    calls = []

    async def flush(_request):
        calls.append(1)
        status = answers[min(len(calls), len(answers)) - 1]
        text = "Cache flushed.\n" if status == 200 else "Cache not flushed because there are pending requests."
        return web.Response(text=text, status=status)

    app = web.Application()
    app.router.add_get("/flush_cache", flush)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    return runner, f"http://127.0.0.1:{port}", calls


def test_flush_cache_is_retried_until_200():
    async def main():
        runner, url, calls = await _serve_flush([400, 400, 400, 200])
        try:
            async with EngineClient(url) as client:
                text = await client.flush_cache(timeout=30, interval=0.01)
        finally:
            await runner.cleanup()
        return text, len(calls)

    text, calls = asyncio.run(main())
    assert calls == 4 and "Cache flushed" in text


def test_flush_cache_gives_up_with_a_clear_error():
    async def main():
        runner, url, calls = await _serve_flush([400])
        try:
            async with EngineClient(url) as client:
                with pytest.raises(EngineHTTPError) as err:
                    await client.flush_cache(timeout=0.3, interval=0.02, max_interval=0.05)
        finally:
            await runner.cleanup()
        return err.value, len(calls)

    error, calls = asyncio.run(main())
    assert calls > 1 and error.status == 400
    assert f"cache not flushed after {calls} attempt(s)" in str(error) and "pending requests" in str(error)


def test_flush_cache_does_not_retry_other_errors():
    async def main():
        runner, url, calls = await _serve_flush([500, 200])
        try:
            async with EngineClient(url) as client:
                with pytest.raises(EngineHTTPError) as err:
                    await client.flush_cache(timeout=30, interval=0.01)
        finally:
            await runner.cleanup()
        return err.value, len(calls)

    error, calls = asyncio.run(main())
    assert error.status == 500 and calls == 1


@pytest.mark.parametrize("error", [
    EngineHTTPError("http://127.0.0.1:1/generate", 503, "no_available_workers"),
    TrainerRankError("train", [(1, ValueError("boom"))]),
    RouterError("router did not start"),
    RequestError("bad field"),
    ArgumentError("--flag is wrong"),
    LatexParseError("\\frac"),
], ids=lambda e: type(e).__name__)
def test_exceptions_that_cross_ray_pickle(error):
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is type(error) and str(back) == str(error)
    fields = {k: v for k, v in vars(error).items() if k != "failures"}
    assert {k: getattr(back, k) for k in fields} == fields
    if isinstance(error, TrainerRankError):
        assert [(r, str(e)) for r, e in back.failures] == [(r, str(e)) for r, e in error.failures]


def test_a_batched_generate_body_has_one_params_dict_per_prompt():
    from slime.utils import engine_requests

    body = engine_requests.generate_batch([[1, 2], [3]], [{"sampling_seed": 1}, {"sampling_seed": 2}], True)
    assert body == {"input_ids": [[1, 2], [3]], "sampling_params": [{"sampling_seed": 1}, {"sampling_seed": 2}],
                    "return_logprob": True}
    with pytest.raises(ValueError, match="one sampling_params dict per prompt"):
        engine_requests.generate_batch([[1, 2], [3]], [{"sampling_seed": 1}])
    with pytest.raises(ValueError, match="at least one prompt"):
        engine_requests.generate_batch([], [])
