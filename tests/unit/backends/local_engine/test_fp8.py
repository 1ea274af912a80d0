"""The local engine serving a block-FP8 checkpoint (tools/make_tiny_model.py --fp8, [32, 32] blocks):
it computes with the dequantised weights, takes FP8 (weight, weight_scale_inv) updates by disk,
distributed (gloo, this process is rank 0) and SGLang's colocated tensor payload, and refuses with 400 a float
tensor for an FP8 weight, a weight without its scale and a scale without its weight."""

import json
import shutil
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from slime.backends.local_engine.fp8 import Fp8Weights
from slime.backends.local_engine.sampling import RequestError
from slime.utils.engine_client import EngineHTTPError, SyncEngineClient
from slime.utils.fp8 import FP8_DTYPE, fp8_config_from_hf, quantize_named
from slime.utils.tensor_payload import serialize_flattened_bucket, use_file_system_sharing
from slime.utils.weight_transport import init_weight_update_group
from tests.unit.backends.local_engine.conftest import free_port, hf_logprobs, write_dequantized_copy

PROMPTS = [[3, 14, 15, 92, 65], [27, 18, 28]]
N_NEW = 8
Q_PROJ = "model.layers.0.self_attn.q_proj.weight"


@pytest.fixture(scope="module")
def url(engine_factory, tiny_moe_fp8_hf):
    return engine_factory(tiny_moe_fp8_hf)


def _served(url):
    client, out = SyncEngineClient(url), []
    for prompt in PROMPTS:
        res = client.generate({"input_ids": prompt, "return_logprob": True,
                               "sampling_params": {"temperature": 0, "max_new_tokens": N_NEW}})
        out.append((prompt, res["output_ids"], [e[0] for e in res["meta_info"]["output_token_logprobs"]]))
    return out


def _check_serves(url, folder, version):
    """The engine's log-probs equal transformers' on the float32 checkpoint in `folder`."""
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    assert SyncEngineClient(url).get_weight_version() == version
    for prompt, ids, lps in _served(url):
        torch.testing.assert_close(torch.tensor(lps), hf_logprobs(model, prompt, ids, 0.0), atol=1e-5, rtol=0)


def _new_fp8_weights(fp8_folder, tiny_moe_hf, seed):
    """The fp32 tiny weights plus seeded noise, quantised as the FP8 checkpoint stores them."""
    gen = torch.Generator().manual_seed(seed)
    plain = {k: v + 0.05 * torch.randn(v.shape, generator=gen) for k, v in load_file(f"{tiny_moe_hf}/model.safetensors").items()}
    config = fp8_config_from_hf(json.loads((fp8_folder / "config.json").read_text()))
    return plain, dict(quantize_named(sorted(plain.items()), config))


def _tensor_update(url, named, version):
    """SGLang's colocated payload (a flattened bucket shared through memory), as the sender makes it."""
    use_file_system_sharing()
    entry, _keep = serialize_flattened_bucket(sorted(named.items()))  # alive until the engine answered
    client = SyncEngineClient(url)
    client.begin_weight_update()  # the engine speaks SGLang 0.5.23's session protocol
    try:
        return client.update_weights_from_tensor([entry], load_format="flattened_bucket", weight_version=version)
    finally:
        client.end_weight_update()


def _distributed_update(url, named, version, group_name):
    client, port = SyncEngineClient(url), free_port()
    names = list(named)
    with ThreadPoolExecutor(1) as pool:
        joined = pool.submit(client.init_weights_update_group, "127.0.0.1", port, 1, 2, group_name, "gloo")
        group = init_weight_update_group("127.0.0.1", port, 0, 2, group_name, "gloo", timeout_s=60)
        joined.result(timeout=60)
        client.begin_weight_update()
        done = pool.submit(client.update_weights_from_distributed, names,
                           [str(named[n].dtype).removeprefix("torch.") for n in names],
                           [list(named[n].shape) for n in names], group_name, True, version)
        for name in names:
            group.broadcast(named[name].clone(), src=0)
        try:
            return done.result(timeout=60)
        finally:
            client.end_weight_update()
            client.destroy_weights_update_group(group_name)


def _disk_update(url, fp8_folder, named, folder, version):
    shutil.copytree(fp8_folder, folder)
    save_file({k: v.contiguous() for k, v in named.items()}, str(folder / "model.safetensors"))
    return SyncEngineClient(url).update_weights_from_disk(str(folder), weight_version=version)


def test_fp8_checkpoint_is_served_dequantised(url, tiny_moe_fp8_hf, tiny_moe_hf, tmp_path):
    _check_serves(url, write_dequantized_copy(tiny_moe_fp8_hf, tmp_path / "deq"), "default")
    fp32 = AutoModelForCausalLM.from_pretrained(tiny_moe_hf, dtype=torch.float32).eval()
    diffs = [(torch.tensor(lps) - hf_logprobs(fp32, p, ids, 0.0)).abs().max() for p, ids, lps in _served(url)]
    assert max(diffs) > 1e-5  # it does not serve the unquantised weights


@pytest.mark.parametrize("transport", ["tensor", "distributed", "disk"])
def test_fp8_update_by_every_transport(url, tiny_moe_fp8_hf, tiny_moe_hf, tmp_path, transport):
    seed = {"tensor": 1, "distributed": 2, "disk": 3}[transport]
    _, named = _new_fp8_weights(tiny_moe_fp8_hf, tiny_moe_hf, seed)
    assert named[Q_PROJ].dtype == FP8_DTYPE and named[Q_PROJ + "_scale_inv"].shape == (2, 2)
    if transport == "tensor":
        _tensor_update(url, named, "fp8-tensor")
    elif transport == "distributed":
        _distributed_update(url, named, "fp8-distributed", "fp8_sync")
    else:
        _disk_update(url, tiny_moe_fp8_hf, named, tmp_path / "new", "fp8-disk")
    _check_serves(url, write_dequantized_copy(tiny_moe_fp8_hf, tmp_path / "deq", named), f"fp8-{transport}")


def _refusals(tiny_moe_fp8_hf, tiny_moe_hf):
    plain, named = _new_fp8_weights(tiny_moe_fp8_hf, tiny_moe_hf, 9)
    scale = Q_PROJ + "_scale_inv"
    return [
        ({n: t.bfloat16() for n, t in plain.items()}, "is FP8"),  # an unquantised (bf16) sync
        ({Q_PROJ: named[Q_PROJ]}, "without"),
        ({scale: named[scale]}, "without its weight"),
        ({"model.norm.weight": named[Q_PROJ][:1, :64].reshape(64)}, "not FP8"),
    ]


@pytest.mark.parametrize("transport", ["tensor", "distributed", "disk"])
def test_unquantised_or_unpaired_updates_are_refused(url, tiny_moe_fp8_hf, tiny_moe_hf, tmp_path, transport):
    client = SyncEngineClient(url)
    before, version = _served(url), client.get_weight_version()
    for i, (named, needle) in enumerate(_refusals(tiny_moe_fp8_hf, tiny_moe_hf)):
        with pytest.raises(EngineHTTPError) as err:
            if transport == "tensor":
                _tensor_update(url, named, "bad")
            elif transport == "distributed":
                _distributed_update(url, named, "bad", f"bad_{i}")
            else:
                _disk_update(url, tiny_moe_fp8_hf, named, tmp_path / f"bad{i}", "bad")
        assert err.value.status == 400 and needle in err.value.body, err.value.body
    assert _served(url) == before and client.get_weight_version() == version


def test_fp8_names_come_from_the_checkpoint(tiny_moe_fp8_hf):
    fp8 = Fp8Weights.from_checkpoint(tiny_moe_fp8_hf)
    assert fp8.block_size == (32, 32) and len(fp8.fp8_names) == 2 * (4 + 8 * 3)
    assert Q_PROJ in fp8.fp8_names and "model.layers.0.mlp.gate.weight" not in fp8.fp8_names
    q = torch.zeros(32, 64, dtype=FP8_DTYPE)
    with pytest.raises(RequestError, match="expected float32"):
        fp8.dequantize_named([(Q_PROJ, q), (Q_PROJ + "_scale_inv", torch.ones(1, 1))])
