"""GPTModel from args: HF-loaded megatron logits equal HF transformers logits (fp32, CPU)."""

import argparse

import pytest
import torch

from tests.unit.backends.megatron_utils.spawn_util import spawn


def _logits_diff(rank, world_size, hf_dir):
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
    args = args_from_hf_config(hf.config)
    initialize_megatron(args)
    model = build_model_for_stage(args).eval()
    wmap = weight_map_for(hf.config)
    load_hf_weights(model, hf, wmap, shard_context_for(model, wmap.num_experts))
    ref = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, hf.config["vocab_size"], (2, 24), generator=gen)
    pos = torch.arange(24).unsqueeze(0).expand(2, -1)
    causal = torch.ones(24, 24, dtype=torch.bool).triu(1).expand(2, 1, 24, 24)
    with torch.no_grad():
        ours = model(ids, pos, attention_mask=causal)[..., : hf.config["vocab_size"]]
        theirs = ref(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    return {
        "max_abs_diff": (ours - theirs).abs().max().item(),
        "logit_scale": theirs.abs().max().item(),
        "shape": tuple(ours.shape),
    }


@pytest.mark.parametrize("variant", ["moe", "dense"])
def test_megatron_logits_match_hf(variant, request, tmp_path):
    hf_dir = request.getfixturevalue(f"tiny_{variant}_hf")
    result = spawn(_logits_diff, 1, tmp_path, hf_dir=str(hf_dir))[0]
    assert result["shape"] == (2, 24, 128)
    assert result["logit_scale"] > 1e-2, "logits too small for the comparison to mean anything"
    assert result["max_abs_diff"] <= 1e-4, result


def test_transformer_engine_impl_without_te_is_a_clear_error():
    from megatron.core.extensions import transformer_engine as te_ext

    from slime.backends.megatron_utils.layer_specs import block_spec_for

    if te_ext.HAVE_TE:
        pytest.skip("Transformer Engine is installed")
    with pytest.raises(ImportError, match="--transformer-impl transformer_engine needs"):
        block_spec_for("transformer_engine", config=None)
    with pytest.raises(ValueError, match="--transformer-impl 'fast'"):
        block_spec_for("fast", config=None)


def test_local_spec_refuses_grouped_gemm():
    from slime.backends.megatron_utils.layer_specs import block_spec_for

    config = argparse.Namespace(num_moe_experts=8, moe_grouped_gemm=True)
    with pytest.raises(ValueError, match="--moe-grouped-gemm needs --transformer-impl transformer_engine"):
        block_spec_for("local", config)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU-only restriction")
def test_context_parallel_on_cpu_names_the_flag():
    from slime.backends.megatron_utils.parallel import check_cpu_parallel_sizes

    with pytest.raises(ValueError, match="--context-parallel-size 2 needs Transformer Engine"):
        check_cpu_parallel_sizes(argparse.Namespace(context_parallel_size=2))
    check_cpu_parallel_sizes(argparse.Namespace(context_parallel_size=1))
    with pytest.raises(ValueError, match="--moe-token-dispatcher-type alltoall uses CUDA streams"):
        check_cpu_parallel_sizes(argparse.Namespace(num_experts=8, moe_token_dispatcher_type="alltoall"))
    check_cpu_parallel_sizes(argparse.Namespace(num_experts=8, moe_token_dispatcher_type="allgather"))


def test_padded_vocab_size():
    from slime.backends.megatron_utils.model_provider import padded_vocab_size

    assert padded_vocab_size(128, 128, 1) == 128
    assert padded_vocab_size(151936, 128, 4) == 152064
    assert padded_vocab_size(1000, 128, 2) == 1024
