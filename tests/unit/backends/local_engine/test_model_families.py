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
