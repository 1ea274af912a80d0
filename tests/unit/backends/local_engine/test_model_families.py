"""The local engine serves the DeepSeek-V3 (MLA: its cache holds the latent and the rotary key) and
GLM-4.5 MoE tiny models as transformers runs them, and a weight update reaches the router's expert
bias (a persistent buffer, `mlp.gate.e_score_correction_bias`)."""

import shutil
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from slime.utils.engine_client import SyncEngineClient
from tests.unit.backends.local_engine.conftest import hf_greedy, hf_logprobs

PROMPTS = [[3, 14, 15, 92, 65, 35], [27, 18, 28]]  # different lengths: batched with left padding
N_NEW = 8


def _generate(url, prompt):
    return SyncEngineClient(url).generate({"input_ids": prompt, "return_logprob": True,
                                           "sampling_params": {"temperature": 0, "max_new_tokens": N_NEW}})


def _check_serves(url, folder):
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        results = list(pool.map(lambda p: _generate(url, p), PROMPTS))
    for prompt, res in zip(PROMPTS, results):
        assert res["output_ids"] == hf_greedy(model, prompt, N_NEW)
        got = torch.tensor([e[0] for e in res["meta_info"]["output_token_logprobs"]])
        torch.testing.assert_close(got, hf_logprobs(model, prompt, res["output_ids"], 0.0), atol=1e-5, rtol=0)
    return [torch.tensor([e[0] for e in r["meta_info"]["output_token_logprobs"]]) for r in results]


@pytest.mark.parametrize("fixture", ["tiny_deepseek_v3_hf", "tiny_glm4_moe_hf"])
def test_engine_serves_family_and_updates_expert_bias(request, engine_factory, tmp_path, fixture):
    hf_dir = request.getfixturevalue(fixture)
    url = engine_factory(hf_dir)
    before = _check_serves(url, hf_dir)
    # a checkpoint whose expert biases alone differ, large enough to change the routing
    shutil.copytree(hf_dir, tmp_path / "biased")
    path = tmp_path / "biased" / "model.safetensors"
    tensors = load_file(str(path))
    gen = torch.Generator().manual_seed(1)
    for name in [n for n in tensors if n.endswith("e_score_correction_bias")]:
        tensors[name] = torch.randn(tensors[name].shape, generator=gen)
    save_file(tensors, str(path), metadata={"format": "pt"})
    SyncEngineClient(url).update_weights_from_disk(str(tmp_path / "biased"), weight_version="biased")
    after = _check_serves(url, tmp_path / "biased")
    # the new biases route differently: the first generated token's logprob moves
    assert any(abs(a[0] - b[0]) > 1e-4 for a, b in zip(after, before))


def test_lone_mla_half_is_refused_naming_both_tensors(engine_factory, tiny_deepseek_v3_hf):
    """SGLang fuses q_a_proj with kv_a_proj_with_mqa only from one load_weights call and drops a lone
    half silently; the local engine refuses such an update (tensor payload and broadcast alike),
    names both tensors and changes nothing; the two halves together load."""
    from concurrent.futures import ThreadPoolExecutor as Pool

    from slime.utils.engine_client import EngineHTTPError
    from slime.utils.tensor_payload import serialize, use_file_system_sharing
    from slime.utils.weight_transport import init_weight_update_group
    from tests.unit.backends.local_engine.conftest import free_port

    use_file_system_sharing()
    url = engine_factory(tiny_deepseek_v3_hf)
    client = SyncEngineClient(url)
    tensors = load_file(str(tiny_deepseek_v3_hf / "model.safetensors"))
    q_a, kv_a = "model.layers.0.self_attn.q_a_proj.weight", "model.layers.0.self_attn.kv_a_proj_with_mqa.weight"
    version = client.get_weight_version()
    client.begin_weight_update()  # the engine speaks SGLang 0.5.23's session protocol
    with pytest.raises(EngineHTTPError) as err:
        client.update_weights_from_tensor([serialize([(q_a, tensors[q_a].clone())])], weight_version="lone")
    assert err.value.status == 400 and q_a in err.value.body and kv_a in err.value.body, err.value.body

    port = free_port()
    with Pool(1) as pool:
        joined = pool.submit(client.init_weights_update_group, "127.0.0.1", port, 1, 2, "mla_sync", "gloo")
        group = init_weight_update_group("127.0.0.1", port, 0, 2, "mla_sync", "gloo", timeout_s=60)
        joined.result(timeout=60)
        done = pool.submit(client.update_weights_from_distributed, [kv_a], ["float32"],
                           [list(tensors[kv_a].shape)], "mla_sync", True, "lone")
        group.broadcast(tensors[kv_a].clone(), src=0)
        with pytest.raises(EngineHTTPError) as err:
            done.result(timeout=60)
    client.destroy_weights_update_group("mla_sync")
    assert err.value.status == 400 and q_a in err.value.body and kv_a in err.value.body, err.value.body
    assert client.get_weight_version() == version

    pair = [(q_a, tensors[q_a].clone()), (kv_a, tensors[kv_a].clone())]
    client.update_weights_from_tensor([serialize(pair)], weight_version="pair")
    client.end_weight_update()
    assert client.get_weight_version() == "pair"
