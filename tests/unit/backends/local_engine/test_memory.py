"""Memory release and resume of the local engine by SGLang's tags, over real HTTP: each tag frees
what it names (reported in /get_server_info's memory_occupation), generation is held while the
weights or the KV cache are released, weight updates are accepted once the weights alone are back,
and resuming restores exactly the outputs of before."""

import asyncio
import time

import pytest

from slime.utils.engine_client import EngineClient, EngineHTTPError, SyncEngineClient

PROMPT = [3, 14, 15, 92, 65]
GREEDY = {"temperature": 0, "max_new_tokens": 8}


@pytest.fixture(scope="module")
def url(engine_factory, tiny_moe_hf):
    return engine_factory(tiny_moe_hf)


def _greedy(url) -> list[int]:
    return SyncEngineClient(url).generate({"input_ids": PROMPT, "sampling_params": GREEDY})["output_ids"]


def _occupation(url) -> dict:
    return SyncEngineClient(url).get_server_info()["memory_occupation"]


def test_release_all_frees_weights_and_resume_restores_exact_outputs(url):
    client = SyncEngineClient(url)
    before, held = _greedy(url), _occupation(url)
    assert held["weights_bytes"] > 0 and held["released_tags"] == []
    client.release_memory_occupation()  # no tags: every tag, as SGLang
    released = _occupation(url)
    assert released["released_tags"] == ["cuda_graph", "kv_cache", "weights"]
    assert released["weights_bytes"] == 0 and released["kv_cache_bytes"] == 0
    client.resume_memory_occupation()
    assert _occupation(url) == held
    assert _greedy(url) == before


def test_generation_is_held_while_the_kv_cache_is_released(url):
    before = _greedy(url)

    async def run():
        async with EngineClient(url) as c:
            await c.release_memory_occupation(["kv_cache"])
            assert (await c.get_server_info())["memory_occupation"]["weights_bytes"] > 0  # weights stay
            task = asyncio.create_task(c.generate({"input_ids": PROMPT, "sampling_params": GREEDY}))
            deadline = time.monotonic() + 60
            while (await c.get_server_info())["waiting"] != 1:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.02)
            assert not task.done()
            await c.resume_memory_occupation(["kv_cache"])
            return await task

    assert asyncio.run(run())["output_ids"] == before


def test_colocated_order_weights_back_first_then_update_then_kv_cache(url, tiny_moe_hf):
    """The colocated loop: release all; resume weights; update; resume kv_cache and cuda_graph."""
    client = SyncEngineClient(url)
    before = _greedy(url)
    client.release_memory_occupation(["weights", "kv_cache", "cuda_graph"])
    with pytest.raises(EngineHTTPError) as err:  # no update into released weights
        client.update_weights_from_disk(str(tiny_moe_hf))
    assert err.value.status == 400 and "released" in err.value.body
    client.resume_memory_occupation(["weights"])
    assert _occupation(url)["released_tags"] == ["cuda_graph", "kv_cache"]
    assert _occupation(url)["weights_bytes"] > 0
    client.update_weights_from_disk(str(tiny_moe_hf), weight_version="7")
    assert client.get_server_info()["paused"] is True  # still no KV cache: generation held
    client.resume_memory_occupation(["kv_cache", "cuda_graph"])
    assert client.get_server_info()["paused"] is False and client.get_weight_version() == "7"
    assert _greedy(url) == before


def test_unknown_tag_is_refused_and_nothing_is_released(url):
    client = SyncEngineClient(url)
    with pytest.raises(EngineHTTPError) as err:
        client.release_memory_occupation(["weights", "optimizer"])
    assert err.value.status == 400 and "optimizer" in err.value.body
    assert _occupation(url)["released_tags"] == []
