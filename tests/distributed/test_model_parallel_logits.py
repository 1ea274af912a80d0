"""Megatron GPTModel on 2 gloo ranks matches HF transformers: TP=2 + sequence parallel + MoE
(our SequenceParallelRMSNorm), and EP=2; for the Qwen3-MoE, DeepSeek-V3 (MLA) and GLM-4.5 families."""

import pytest
import torch

from tests.unit.backends.megatron_utils.spawn_util import spawn

pytestmark = pytest.mark.distributed


def _logits(rank, world_size, hf_dir, layout):
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    from slime.backends.megatron_utils.hf_io import HFCheckpoint
    from slime.backends.megatron_utils.hf_loader import (
        args_from_hf_config,
        load_hf_weights,
        shard_context_for,
    )
    from slime.backends.megatron_utils.model_provider import build_model_for_stage
    from slime.backends.megatron_utils.parallel import initialize_megatron
    from slime.models import weight_map_for

    hf = HFCheckpoint(hf_dir)
    args = args_from_hf_config(hf.config, **layout)
    initialize_megatron(args)
    model = build_model_for_stage(args).eval()
    wmap = weight_map_for(hf.config, tp_size=args.tensor_model_parallel_size)
    load_hf_weights(model, hf, wmap, shard_context_for(model, wmap.num_experts))
    norms = [p for n, p in model.named_parameters() if n.endswith("layernorm.weight")]
    sp_marked = all(getattr(p, "sequence_parallel", False) for p in norms)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, hf.config["vocab_size"], (2, 16), generator=gen)
    pos = torch.arange(16).unsqueeze(0).expand(2, -1)
    causal = torch.ones(16, 16, dtype=torch.bool).triu(1).expand(2, 1, 16, 16)
    with torch.no_grad():
        local = model(ids, pos, attention_mask=causal)
        parts = [torch.empty_like(local) for _ in range(args.tensor_model_parallel_size)]
        from megatron.core import parallel_state as mpu

        dist.all_gather(parts, local.contiguous(), group=mpu.get_tensor_model_parallel_group())
        ours = torch.cat(parts, dim=-1)[..., : hf.config["vocab_size"]]
        ref = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
        theirs = ref(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    states = get_cuda_rng_tracker().get_states()
    return {
        "max_abs_diff": (ours - theirs).abs().max().item(),
        "sp_marked": sp_marked,
        "rng": {name: state.sum().item() for name, state in states.items()},
    }


TP2_SP = {"tensor_model_parallel_size": 2, "sequence_parallel": True}
EP2 = {"expert_model_parallel_size": 2}


@pytest.mark.parametrize("fixture, layout", [
    ("tiny_moe_hf", TP2_SP),
    ("tiny_moe_hf", {**TP2_SP, "expert_tensor_parallel_size": 2}),
    ("tiny_moe_hf", EP2),
    ("tiny_deepseek_v3_hf", TP2_SP),
    ("tiny_deepseek_v3_hf", EP2),
    ("tiny_glm4_moe_hf", TP2_SP),
    ("tiny_glm4_moe_hf", EP2),
], ids=["tp2-sp", "tp2-sp-etp2", "ep2", "deepseek_v3-tp2-sp", "deepseek_v3-ep2", "glm4_moe-tp2-sp", "glm4_moe-ep2"])
def test_moe_model_parallel_logits_match_hf(request, tmp_path, fixture, layout):
    hf_dir = request.getfixturevalue(fixture)
    results = spawn(_logits, 2, tmp_path, hf_dir=str(hf_dir), layout=layout)
    for result in results:
        assert result["max_abs_diff"] <= 1e-4, result
        assert result["sp_marked"] == bool(layout.get("sequence_parallel")), result
    # CPU model-parallel seeding: same data-parallel stream, per-TP-rank model-parallel stream.
    rng = [r["rng"] for r in results]
    assert set(rng[0]) == {"data-parallel-rng", "model-parallel-rng", "expert-parallel-rng"}
    assert rng[0]["data-parallel-rng"] == rng[1]["data-parallel-rng"]
    tp = layout.get("tensor_model_parallel_size", 1) > 1
    assert (rng[0]["model-parallel-rng"] != rng[1]["model-parallel-rng"]) == tp
    assert (rng[0]["expert-parallel-rng"] != rng[1]["expert-parallel-rng"]) == (
        layout.get("expert_model_parallel_size", 1) > 1 or layout.get("expert_tensor_parallel_size", 1) > 1
    )


def _te_logits(rank, world_size, hf_dir):
    """Logits of the Transformer Engine spec (one GPU, NCCL) against HF transformers on the GPU."""
    from transformers import AutoModelForCausalLM

    from slime.backends.megatron_utils.hf_io import HFCheckpoint
    from slime.backends.megatron_utils.hf_loader import args_from_hf_config, load_hf_weights, shard_context_for
    from slime.backends.megatron_utils.model_provider import build_model_for_stage
    from slime.backends.megatron_utils.parallel import initialize_megatron
    from slime.models import weight_map_for

    torch.cuda.set_device(0)
    hf = HFCheckpoint(hf_dir)
    args = args_from_hf_config(hf.config, transformer_impl="transformer_engine", distributed_backend="nccl",
                               moe_token_dispatcher_type="alltoall")
    initialize_megatron(args)
    model = build_model_for_stage(args).cuda().eval()
    wmap = weight_map_for(hf.config, tp_size=1)
    load_hf_weights(model, hf, wmap, shard_context_for(model, wmap.num_experts))
    ids = torch.randint(0, hf.config["vocab_size"], (2, 16), generator=torch.Generator().manual_seed(0)).cuda()
    pos = torch.arange(16, device="cuda").unsqueeze(0).expand(2, -1)
    with torch.no_grad():
        ours = model(ids, pos, attention_mask=None)[..., : hf.config["vocab_size"]]
        ref = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).cuda().eval()
        theirs = ref(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    return {"max_abs_diff": (ours.float() - theirs).abs().max().item()}


@pytest.mark.gpu
@pytest.mark.te
@pytest.mark.parametrize("fixture", ["tiny_moe_hf", "tiny_deepseek_v3_hf", "tiny_glm4_moe_hf"])
def test_te_spec_logits_match_hf(request, tmp_path, fixture):
    """TE layer spec (fp32) on CUDA equals transformers within GPU kernel tolerance (TF32 off by default);
    for DeepSeek-V3 this is TE's MLA (fused latent norms, duplicated down projections)."""
    (result,) = spawn(_te_logits, 1, tmp_path, hf_dir=str(request.getfixturevalue(fixture)))
    assert result["max_abs_diff"] <= 1e-3, result
