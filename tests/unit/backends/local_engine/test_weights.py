"""Weight updates of the local engine over real HTTP: disk, distributed (gloo, this process is rank 0)
and SGLang's tensor payload (flattened bucket or (name, tensor) pairs through shared memory) each make the engine generate exactly what transformers generates with the new
weights, and report the new version; bad updates get 400; memory release/resume keeps the weights.
The engine speaks SGLang 0.5.23's protocol strictly: tensor and distributed updates run inside a
/begin_weight_update ... /end_weight_update session and are refused outside one."""

import contextlib
import glob
import os
import shutil
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from slime.utils.engine_client import EngineHTTPError, SyncEngineClient
from slime.utils.tensor_payload import (FLATTENED_BUCKET, flatten_unpadded, serialize, serialize_flattened_bucket,
                                       use_file_system_sharing)
from slime.utils.weight_transport import init_weight_update_group
from tests.unit.backends.local_engine.conftest import free_port, hf_greedy, hf_logprobs

PROMPTS = [[3, 14, 15, 92, 65], [27, 18, 28]]
N_NEW = 12


@pytest.fixture(scope="module")
def url(engine_factory, tiny_moe_hf):
    return engine_factory(tiny_moe_hf)


@pytest.fixture(scope="module")
def perturbed(tiny_moe_hf, tmp_path_factory):
    """`make(seed) -> (folder, {hf_name: tensor})`: the tiny checkpoint with seeded noise on every tensor."""

    def make(seed):
        folder = tmp_path_factory.mktemp(f"perturbed_{seed}")
        shutil.copytree(tiny_moe_hf, folder, dirs_exist_ok=True)
        gen = torch.Generator().manual_seed(seed)
        named = {}
        for path in glob.glob(os.path.join(folder, "*.safetensors")):
            tensors = {k: v + 0.05 * torch.randn(v.shape, generator=gen, dtype=v.dtype) for k, v in load_file(path).items()}
            save_file(tensors, path)
            named.update(tensors)
        return folder, named

    return make


@contextlib.contextmanager
def _session(client):
    """A weight-update session around the block (closed even when the block fails)."""
    client.begin_weight_update()
    try:
        yield
    finally:
        client.end_weight_update()


def _check_engine_serves(url, folder, version):
    """The engine's greedy outputs and logprobs equal transformers' with the checkpoint in `folder`."""
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    client = SyncEngineClient(url)
    assert client.get_weight_version() == version
    for prompt in PROMPTS:
        res = client.generate({"input_ids": prompt, "return_logprob": True,
                               "sampling_params": {"temperature": 0, "max_new_tokens": N_NEW}})
        assert res["output_ids"] == hf_greedy(model, prompt, N_NEW)
        assert res["meta_info"]["weight_version"] == version
        got = torch.tensor([e[0] for e in res["meta_info"]["output_token_logprobs"]])
        torch.testing.assert_close(got, hf_logprobs(model, prompt, res["output_ids"], 0.0), atol=1e-5, rtol=0)


def _outputs(url):
    client = SyncEngineClient(url)
    return [client.generate({"input_ids": p, "sampling_params": {"temperature": 0, "max_new_tokens": N_NEW}})["output_ids"]
            for p in PROMPTS]


def test_update_from_disk(url, perturbed, tiny_moe_hf):
    before = _outputs(url)
    _check_engine_serves(url, tiny_moe_hf, "default")
    folder, _ = perturbed(1)
    SyncEngineClient(url).update_weights_from_disk(str(folder), weight_version="disk-1")
    assert _outputs(url) != before
    _check_engine_serves(url, folder, "disk-1")


@pytest.mark.parametrize("load_format", [None, FLATTENED_BUCKET])
def test_update_from_distributed_gloo_group(url, perturbed, load_format):
    """One broadcast per tensor, or one of the whole bucket's bytes (`flatten_unpadded`)."""
    folder, named = perturbed(2 if load_format is None else 5)
    client, port = SyncEngineClient(url), free_port()
    names = sorted(named)
    flattened, metadata = flatten_unpadded((n, named[n]) for n in names)
    if load_format is not None:
        names = [m.name for m in metadata]
    version = f"dist-{load_format}"
    with ThreadPoolExecutor(1) as pool:
        joined = pool.submit(client.init_weights_update_group, "127.0.0.1", port, 1, 2, "test_sync", "gloo")
        group = init_weight_update_group("127.0.0.1", port, 0, 2, "test_sync", "gloo", timeout_s=60)
        joined.result(timeout=60)
        with _session(client):
            done = pool.submit(client.update_weights_from_distributed, names,
                               [str(named[n].dtype).removeprefix("torch.") for n in names],
                               [list(named[n].shape) for n in names], "test_sync", True, version, load_format)
            for tensor in [flattened] if load_format else [named[n].clone() for n in names]:
                group.broadcast(tensor, src=0)
            done.result(timeout=60)
    client.destroy_weights_update_group("test_sync")
    _check_engine_serves(url, folder, version)
    with pytest.raises(EngineHTTPError):
        client.destroy_weights_update_group("test_sync")


def test_update_from_tensor_flattened_bucket_and_pairs(url, perturbed):
    use_file_system_sharing()
    folder, named = perturbed(3)
    client = SyncEngineClient(url)
    entry, keep = serialize_flattened_bucket(sorted(named.items()))  # keep: alive until the engine answered
    with _session(client):
        client.update_weights_from_tensor([entry], load_format="flattened_bucket", weight_version="7")
    _check_engine_serves(url, folder, "7")
    # load_format None: a list of (name, tensor) pairs; without weight_version the version stays
    # (SGLang sets it only when the request carries one)
    pairs = [(n, t.clone()) for n, t in sorted(named.items())]
    with _session(client):
        client.update_weights_from_tensor([serialize(pairs)])
    _check_engine_serves(url, folder, "7")
    del keep


def test_updates_outside_a_session_are_refused_as_sglang_0_5_23_does(url, perturbed):
    """0.5.23's scheduler refuses tensor and distributed updates outside begin/end (HTTP 400,
    success false, its message); a second begin and an end without begin are refused too."""
    use_file_system_sharing()
    client = SyncEngineClient(url)
    assert client.get_server_info()["version"] == "0.5.23"
    before, version = _outputs(url), client.get_weight_version()
    _, named = perturbed(5)
    entry, keep = serialize_flattened_bucket(sorted(named.items()))
    with pytest.raises(EngineHTTPError) as err:
        client.update_weights_from_tensor([entry], load_format="flattened_bucket", weight_version="stale")
    assert err.value.status == 400 and "between begin_weight_update() and end_weight_update()" in err.value.body
    with pytest.raises(EngineHTTPError) as err:
        client.update_weights_from_distributed(["model.norm.weight"], ["float32"], [[64]], "weight_update_group")
    assert err.value.status == 400 and "update_weights_from_distributed must run between" in err.value.body
    with pytest.raises(EngineHTTPError) as err:
        client.end_weight_update()
    assert err.value.status == 400 and "no weight-update session is open" in err.value.body
    with _session(client):
        with pytest.raises(EngineHTTPError) as err:
            client.begin_weight_update()
        assert err.value.status == 400 and "already open" in err.value.body
    assert _outputs(url) == before and client.get_weight_version() == version
    del keep


def test_bad_updates_get_400_and_change_nothing(url):
    use_file_system_sharing()
    client = SyncEngineClient(url)
    client.begin_weight_update()
    before, version = _outputs(url), client.get_weight_version()
    bad = [([("model.no_such.weight", torch.zeros(2))], "no_such"),
           ([("model.norm.weight", torch.zeros(3)), ("model.embed_tokens.weight", torch.zeros(128, 64))], "shape")]
    for named, needle in bad:
        entry, keep = serialize_flattened_bucket(named)
        with pytest.raises(EngineHTTPError) as err:
            client.update_weights_from_tensor([entry], load_format="flattened_bucket", weight_version="bad")
        assert err.value.status == 400 and needle in err.value.body
    refused = [([serialize({"flattened_tensor": torch.zeros(4, dtype=torch.uint8), "metadata": [os.system]})],
                "flattened_bucket", "refused global"),
               ([serialize([("model.norm.weight", torch.zeros(64))])], "direct", "load_format"),
               (["not base64!"], "flattened_bucket", "base64")]
    for entries, load_format, needle in refused:
        with pytest.raises(EngineHTTPError) as err:
            client.update_weights_from_tensor(entries, load_format=load_format)
        assert err.value.status == 400 and needle in err.value.body, err.value.body
    with pytest.raises(EngineHTTPError) as err:
        client.update_weights_from_disk("/nonexistent/folder")
    assert err.value.status == 400
    with pytest.raises(EngineHTTPError) as err:
        client.update_weights_from_distributed(["model.norm.weight"], ["float32"], [[64]], "no_group")
    assert err.value.status == 400 and "no_group" in err.value.body
    client.end_weight_update()
    assert _outputs(url) == before and client.get_weight_version() == version


def test_release_and_resume_memory_keep_the_weights(url):
    client = SyncEngineClient(url)
    before = _outputs(url)
    client.release_memory_occupation()
    assert client.get_server_info()["released"] is True
    client.resume_memory_occupation(["weights", "kv_cache", "cuda_graph"])
    assert client.get_server_info()["released"] is False
    assert _outputs(url) == before


def test_release_while_busy_and_resume_of_a_tag_not_released_are_refused(url):
    """SGLang asserts idleness in release (the server dies) and removes each resumed tag from its
    released set (KeyError): the local engine answers 400 instead, changing nothing."""
    import asyncio

    from slime.utils.engine_client import EngineClient

    client = SyncEngineClient(url)
    with pytest.raises(EngineHTTPError) as err:
        client.resume_memory_occupation(["kv_cache"])
    assert err.value.status == 400 and "not released" in err.value.body

    async def release_while_generating():
        """Freeze a long request mid-generation (pause in_place keeps it running), then release."""
        async with EngineClient(url) as c:
            while True:  # a request that finished before the pause leaves nothing running: again
                task = asyncio.create_task(c.generate({"input_ids": PROMPTS[0], "sampling_params": {
                    "temperature": 0, "max_new_tokens": 400, "ignore_eos": True}}))
                while (await c.get_server_info())["running"] != 1 and not task.done():
                    await asyncio.sleep(0.01)
                await c.pause_generation(mode="in_place")
                if (await c.get_server_info())["running"] == 1:
                    break
                await c.continue_generation()
                await task
            try:
                await c.release_memory_occupation()
            finally:
                await c.continue_generation()
                await task

    with pytest.raises(EngineHTTPError) as err:
        asyncio.run(release_while_generating())
    assert err.value.status == 400 and "only when server is idle" in err.value.body
    assert client.get_server_info()["released"] is False
    client.release_memory_occupation(["kv_cache"])
    with pytest.raises(EngineHTTPError) as err:
        client.resume_memory_occupation()  # null = every tag; weights and cuda_graph were not released
    assert err.value.status == 400 and "not released" in err.value.body
    client.resume_memory_occupation(["kv_cache"])
    assert client.get_server_info()["released"] is False


def test_requests_wait_while_memory_is_released(url):
    import asyncio
    import time

    from slime.utils.engine_client import EngineClient

    client = SyncEngineClient(url)
    before = _outputs(url)

    async def run():
        async with EngineClient(url) as c:
            await c.release_memory_occupation()
            task = asyncio.create_task(c.generate({"input_ids": PROMPTS[0],
                                                   "sampling_params": {"temperature": 0, "max_new_tokens": N_NEW}}))
            deadline = time.monotonic() + 60
            while (await c.get_server_info())["waiting"] != 1:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.02)
            assert not task.done()
            await c.resume_memory_occupation()
            return await task

    assert asyncio.run(run())["output_ids"] == before[0]
    assert client.get_server_info()["released"] is False


def test_distributed_update_with_a_bad_name_drains_the_broadcasts_and_changes_nothing(url, perturbed):
    _, named = perturbed(4)
    client, port = SyncEngineClient(url), free_port()
    before, version = _outputs(url), client.get_weight_version()
    good = "model.norm.weight"
    payload = {"model.no_such.weight": torch.ones(3), good: named[good]}
    with ThreadPoolExecutor(1) as pool:
        joined = pool.submit(client.init_weights_update_group, "127.0.0.1", port, 1, 2, "bad_sync", "gloo")
        group = init_weight_update_group("127.0.0.1", port, 0, 2, "bad_sync", "gloo", timeout_s=60)
        joined.result(timeout=60)
        with _session(client):
            done = pool.submit(client.update_weights_from_distributed, list(payload), ["float32"] * 2,
                               [list(t.shape) for t in payload.values()], "bad_sync", True, "bad")
            for tensor in payload.values():
                group.broadcast(tensor.clone(), src=0)
            with pytest.raises(EngineHTTPError) as err:
                done.result(timeout=60)
    client.destroy_weights_update_group("bad_sync")
    assert err.value.status == 400 and "no_such" in err.value.body
    assert _outputs(url) == before and client.get_weight_version() == version


def test_a_misaligned_flattened_bucket_is_received_then_refused(url, perturbed):
    """A float32 tensor announced after 3 bytes of uint8 cannot be viewed in place: the engine
    takes the broadcast (the sender does not hang), answers 400 naming the tensor, loads nothing."""
    _, named = perturbed(6)
    client, port = SyncEngineClient(url), free_port()
    before, version = _outputs(url), client.get_weight_version()
    good = "model.norm.weight"
    flattened = torch.cat([torch.zeros(3, dtype=torch.uint8), named[good].view(torch.uint8)])
    with ThreadPoolExecutor(1) as pool:
        joined = pool.submit(client.init_weights_update_group, "127.0.0.1", port, 1, 2, "odd_sync", "gloo")
        group = init_weight_update_group("127.0.0.1", port, 0, 2, "odd_sync", "gloo", timeout_s=60)
        joined.result(timeout=60)
        with _session(client):
            done = pool.submit(client.update_weights_from_distributed, ["model.odd_bytes", good], ["uint8", "float32"],
                               [[3], list(named[good].shape)], "odd_sync", True, "odd", FLATTENED_BUCKET)
            group.broadcast(flattened, src=0)
            with pytest.raises(EngineHTTPError) as err:
                done.result(timeout=60)
    client.destroy_weights_update_group("odd_sync")
    assert err.value.status == 400 and good in err.value.body and "element size" in err.value.body
    assert _outputs(url) == before and client.get_weight_version() == version


def test_group_requests_without_group_name_use_sglangs_default(url, perturbed):
    """io_struct's group requests default group_name to "weight_update_group": a body without it
    joins, updates and destroys that group (SGLang's behaviour), and the version stays when the
    update carries none."""
    import requests

    folder, named = perturbed(4)
    names, port = sorted(named), free_port()
    version = SyncEngineClient(url).get_weight_version()
    with ThreadPoolExecutor(1) as pool:
        joined = pool.submit(requests.post, f"{url}/init_weights_update_group", timeout=60, json={
            "master_address": "127.0.0.1", "master_port": port, "rank_offset": 1, "world_size": 2,
            "backend": "gloo"})
        group = init_weight_update_group("127.0.0.1", port, 0, 2, "weight_update_group", "gloo", timeout_s=60)
        assert joined.result(timeout=60).status_code == 200
        assert requests.post(f"{url}/begin_weight_update", json={}, timeout=10).status_code == 200
        done = pool.submit(requests.post, f"{url}/update_weights_from_distributed", timeout=60, json={
            "names": names, "dtypes": [str(named[n].dtype).removeprefix("torch.") for n in names],
            "shapes": [list(named[n].shape) for n in names]})
        for name in names:
            group.broadcast(named[name].clone(), src=0)
        assert done.result(timeout=60).status_code == 200
        assert requests.post(f"{url}/end_weight_update", json={}, timeout=10).status_code == 200
    assert requests.post(f"{url}/destroy_weights_update_group", json={}, timeout=10).status_code == 200
    group.destroy()
    _check_engine_serves(url, folder, version)
