"""Weight sync into a real SGLang engine serving the tiny MoE (needs CUDA and sglang installed).

The engine is started by our launcher (`slime.backends.sglang_utils.engine.launch`) from parsed
flags, so the launch line is the one a job would use. Each sender then pushes perturbed weights
and the engine must generate what transformers generates with them: the colocated sender through
SGLang's /update_weights_from_tensor (CUDA IPC handles in a flattened bucket, one GPU), the
distributed sender through an NCCL broadcast group (two GPUs: NCCL refuses two ranks on one).
"""

import pytest
import torch

from slime.backends.megatron_utils.update_weight import UpdateWeightFromDistributed, UpdateWeightFromTensor
from slime.backends.megatron_utils.weight_export import bucket_by_bytes
from slime.utils.engine_client import SyncEngineClient
from slime.utils.misc import free_port
from tests.distributed.megatron_harness import TINY_RL_ARGS, model_argv
from tests.distributed.test_weight_sync import PROMPTS, perturbed

pytestmark = pytest.mark.gpu
sglang = pytest.importorskip("sglang")

BUCKET = 64 * 1024


def _args(hf_dir, gpus: int):
    from slime.utils.arguments import parse_args

    return parse_args(model_argv(str(hf_dir)) + TINY_RL_ARGS + [
        "--hf-checkpoint", str(hf_dir), "--prompt-data", f"{hf_dir}/config.json",
        "--actor-num-nodes", "1", "--actor-num-gpus-per-node", "1", "--rollout-num-gpus", "1",
        "--rollout-num-gpus-per-engine", "1", "--rollout-engine", "sglang",
        "--sglang-mem-fraction-static", "0.2", "--sglang-disable-cuda-graph"])


@pytest.fixture(scope="module")
def sglang_engine(tiny_moe_hf, tmp_path_factory):
    from slime.backends.sglang_utils.engine import launch

    port = free_port()
    log = tmp_path_factory.mktemp("sglang") / "engine.log"
    engine = launch(_args(tiny_moe_hf, 1), engine_rank=0, host="127.0.0.1", port=port, log_path=str(log))
    yield engine.url
    engine.stop()


def _assert_serves(url, folder, version):
    """Greedy ids equal transformers' with `folder`'s weights; log-probs within GPU kernel noise."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    client = SyncEngineClient(url)
    assert client.get_weight_version() == version
    for prompt in PROMPTS:
        res = client.generate({"input_ids": prompt, "return_logprob": True,
                               "sampling_params": {"temperature": 0, "max_new_tokens": 8}})
        ids, lps = res["output_ids"], [e[0] for e in res["meta_info"]["output_token_logprobs"]]
        with torch.no_grad():
            want = torch.log_softmax(model(input_ids=torch.tensor([prompt + ids])).logits[0, len(prompt) - 1: -1], -1)
        assert ids == want.argmax(-1).tolist()
        torch.testing.assert_close(torch.tensor(lps), want.gather(1, torch.tensor(ids)[:, None])[:, 0],
                                   atol=2e-3, rtol=0)


def test_colocated_cuda_ipc_sync(sglang_engine, tiny_moe_hf, tmp_path):
    named = perturbed(tiny_moe_hf, tmp_path / "new", seed=1)
    on_gpu = sorted((n, t.cuda()) for n, t in named.items())
    sender = UpdateWeightFromTensor([sglang_engine], lambda: bucket_by_bytes(on_gpu, BUCKET))
    sender.connect()
    assert sender.update_weights("ipc-1") == "ipc-1"
    _assert_serves(sglang_engine, tmp_path / "new", "ipc-1")
    sender.disconnect()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL needs the trainer and the engine on two GPUs")
def test_distributed_nccl_sync(tiny_moe_hf, tmp_path):
    from slime.backends.sglang_utils.engine import launch

    engine = launch(_args(tiny_moe_hf, 1), engine_rank=0, host="127.0.0.1", port=free_port(),
                    visible_devices="1", log_path=str(tmp_path / "engine.log"))
    try:
        named = perturbed(tiny_moe_hf, tmp_path / "new", seed=2)
        sender = UpdateWeightFromDistributed([engine.url], lambda: bucket_by_bytes(sorted(named.items()), BUCKET),
                                             backend="nccl")
        sender.connect()
        assert sender.update_weights("nccl-1") == "nccl-1"
        _assert_serves(engine.url, tmp_path / "new", "nccl-1")
        sender.disconnect()
    finally:
        engine.stop()
