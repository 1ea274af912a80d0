"""megatron-core's configs built before any process group (config_check): refusals name our flags,
the Transformer Engine stand-in leaves megatron-core as it found it, start-up builds for this machine."""

import importlib.util

import pytest

from slime.backends.megatron_utils.kernels import Kernels
from slime.backends.megatron_utils.config_check import (
    ConfigRefused,
    check_megatron_configs,
    flags_named_in,
    transformer_engine_as_on_gpu,
)
from slime.utils.arguments import build_parser, parse_args
from tests.unit.utils.arguments.recipes import QWEN3_30B_A3B_MODEL_ARGS

TINY = ("--num-layers 2 --hidden-size 64 --ffn-hidden-size 128 --num-attention-heads 4 --vocab-size 128 "
        "--swiglu --normalization RMSNorm --disable-bias-linear --transformer-impl local --position-embedding-type rope "
        "--actor-num-gpus-per-node 1 --rollout-num-gpus 1 --prompt-data p.jsonl --global-batch-size 8 "
        "--rollout-batch-size 8 --num-rollout 1 --hf-checkpoint /nonexistent --dry-run").split()


@pytest.mark.parametrize("message, flags", [
    ("num_attention_heads (30) must be a multiple of tensor_model_parallel_size (4).",
     ["--num-attention-heads", "--tensor-model-parallel-size"]),
    ("--use-precision-aware-optimizer only supported with distributed optimizer",
     ["--use-precision-aware-optimizer"]),
    ("apply_rope_fusion for MLA only works with YARN RoPE.", ["--no-rope-fusion"]),
    ("When bias_activation_fusion is True, gated_linear_unit is False", ["--no-bias-swiglu-fusion", "--swiglu"]),
    ("layernorm_epsilon and num_moe_experts and grad_reduce_in_fp32", ["--norm-epsilon", "--num-experts",
                                                                      "--accumulate-allreduce-grads-in-fp32"]),
    ("something unrelated to any flag", []),
])
def test_megatron_messages_name_our_flags(message, flags):
    assert flags_named_in(message, build_parser("train")) == flags


def test_transformer_engine_stand_in_restores_megatron():
    import megatron.core.utils as mcore_utils
    from megatron.core.models.common.embeddings import rope_utils
    from megatron.core.transformer.moe import moe_utils

    before = (mcore_utils._te_version, rope_utils.fused_apply_rotary_pos_emb, hasattr(moe_utils, "fused_permute"))
    with transformer_engine_as_on_gpu("2.8.0"):
        assert mcore_utils.is_te_min_version("2.1.0") and not mcore_utils.is_te_min_version("2.9.0")
        assert rope_utils.fused_apply_rotary_pos_emb is not None and moe_utils.fused_permute is not None
        with pytest.raises(RuntimeError, match="configs only"):
            moe_utils.fused_permute()
    after = (mcore_utils._te_version, rope_utils.fused_apply_rotary_pos_emb, hasattr(moe_utils, "fused_permute"))
    assert after == before


def test_dry_run_builds_for_the_gpu_and_start_up_for_this_machine():
    """--dry-run: the GPU run's values (fusions on); start-up: this machine's (without CUDA every
    fusion off, as the CPU run's ranks build the config)."""
    dry = dict(check_megatron_configs(parse_args(TINY)))
    assert dry["actor TransformerConfig"] == ("torch.float32, fusions: masked_softmax_fusion, "
                                              "bias_activation_fusion, apply_rope_fusion, gradient_accumulation_fusion")
    assert "fused_weight_gradient_mlp_cuda" in dry["gradient_accumulation_fusion"]
    args = parse_args(TINY)
    args.dry_run = False
    start_up = dict(check_megatron_configs(args, Kernels(cuda=False, transformer_engine=False, apex_grad_accum=False)))
    assert start_up["actor TransformerConfig"] == "torch.float32, fusions: none"
    assert "gradient_accumulation_fusion" not in start_up and "Transformer Engine" not in start_up


@pytest.mark.skipif(importlib.util.find_spec("transformer_engine") is not None, reason="TE present")
def test_start_up_without_transformer_engine_refuses_te_only_flags_naming_them():
    args = parse_args(QWEN3_30B_A3B_MODEL_ARGS + TINY[TINY.index("--actor-num-gpus-per-node"):]
                      + ["--distributed-backend", "gloo"])  # a CPU run
    args.dry_run = False
    with pytest.raises(ConfigRefused, match="^--moe-permute-fusion: .*needs Transformer Engine"):
        check_megatron_configs(args)


def test_ppo_builds_the_critic_configs_too():
    rows = dict(check_megatron_configs(parse_args(TINY + ["--advantage-estimator", "ppo", "--critic-num-gpus-per-node",
                                                          "1", "--lr", "1e-5"])))
    assert {"actor TransformerConfig", "critic TransformerConfig", "critic OptimizerConfig", "critic DDP config"} <= set(rows)


def test_without_megatron_core_the_check_says_how_to_install_it(monkeypatch):
    import importlib.util as util

    find_spec = util.find_spec
    monkeypatch.setattr(util, "find_spec", lambda name, *a: None if name.startswith("megatron") else find_spec(name, *a))
    with pytest.raises(ConfigRefused, match=r"megatron-core is not installed: .*pip install -e '\.\[megatron\]'"):
        check_megatron_configs(parse_args(TINY))
