"""TransformerConfig / OptimizerConfig / DDP config built from Megatron-LM args."""

import argparse
import contextlib
import importlib.util

import pytest
import torch

from slime.backends.megatron_utils.config import (
    ddp_config_from_args,
    optimizer_config_from_args,
    parse_moe_layer_freq,
    transformer_config_from_args,
)

# scripts/models/qwen3-30B-A3B.sh MODEL_ARGS, as parsed dest names.
QWEN3_30B_A3B = dict(
    num_layers=48, hidden_size=2048, ffn_hidden_size=6144, num_attention_heads=32,
    group_query_attention=True, num_query_groups=4, kv_channels=128, normalization="RMSNorm",
    norm_epsilon=1e-6, position_embedding_type="rope", rotary_base=1000000, rotary_percent=1.0,
    swiglu=True, add_bias_linear=False, qk_layernorm=True, untie_embeddings_and_output_weights=True,
    vocab_size=151936, num_experts=128, moe_ffn_hidden_size=768, moe_router_topk=8,
    moe_layer_freq="[1]*48", moe_router_score_function="softmax",
    moe_token_dispatcher_type="alltoall", moe_grouped_gemm=True, moe_router_dtype="fp32",
    moe_aux_loss_coeff=1e-3, tensor_model_parallel_size=4, sequence_parallel=True,
    pipeline_model_parallel_size=1, context_parallel_size=1, expert_model_parallel_size=8,
    expert_tensor_parallel_size=1, recompute_granularity="full", recompute_method="uniform",
    recompute_num_layers=1, bf16=True, attention_dropout=0.0, hidden_dropout=0.0,
    init_method_std=0.02, lr=1e-6, optimizer="adam", adam_beta1=0.9, adam_beta2=0.98,
    adam_eps=1e-8, weight_decay=0.1, clip_grad=1.0, use_distributed_optimizer=True,
    optimizer_cpu_offload=True, overlap_cpu_optimizer_d2h_h2d=True,
    use_precision_aware_optimizer=True, accumulate_allreduce_grads_in_fp32=True,
)
TINY_DENSE = dict(
    num_layers=2, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4,
    group_query_attention=True, num_query_groups=2, kv_channels=16, normalization="RMSNorm",
    norm_epsilon=1e-6, swiglu=True, add_bias_linear=False, qk_layernorm=True,
    untie_embeddings_and_output_weights=True, vocab_size=128, tensor_model_parallel_size=1,
    lr=1e-5, optimizer="adam", adam_beta1=0.9, adam_beta2=0.98, weight_decay=0.0, clip_grad=1.0,
)
TINY_MOE = dict(
    TINY_DENSE, num_experts=8, moe_ffn_hidden_size=32, moe_router_topk=2, moe_layer_freq="[1, 1]",
    moe_router_score_function="softmax", moe_token_dispatcher_type="allgather",
    moe_router_dtype="fp32", expert_model_parallel_size=2, expert_tensor_parallel_size=1,
)


def _args(base, **kw):
    return argparse.Namespace(**{**base, **kw})


def test_qwen3_30b_a3b_transformer_config():
    cfg = transformer_config_from_args(_args(QWEN3_30B_A3B))
    assert (cfg.num_layers, cfg.hidden_size, cfg.ffn_hidden_size) == (48, 2048, 6144)
    assert (cfg.num_attention_heads, cfg.num_query_groups, cfg.kv_channels) == (32, 4, 128)
    assert cfg.num_moe_experts == 128 and cfg.moe_router_topk == 8 and cfg.moe_ffn_hidden_size == 768
    assert cfg.moe_layer_freq == [1] * 48
    assert cfg.gated_linear_unit and cfg.activation_func is torch.nn.functional.silu
    assert cfg.qk_layernorm and cfg.normalization == "RMSNorm" and not cfg.add_bias_linear
    assert cfg.params_dtype == torch.bfloat16 and cfg.bf16
    assert cfg.tensor_model_parallel_size == 4 and cfg.sequence_parallel
    assert cfg.expert_model_parallel_size == 8 and cfg.expert_tensor_parallel_size == 1
    assert cfg.recompute_granularity == "full" and cfg.recompute_num_layers == 1
    assert cfg.moe_router_dtype == "fp32" and cfg.moe_aux_loss_coeff == 1e-3


def test_qwen3_30b_a3b_optimizer_and_ddp_config():
    args = _args(QWEN3_30B_A3B, use_precision_aware_optimizer=False)
    opt = optimizer_config_from_args(args)
    assert opt.optimizer == "adam" and opt.lr == 1e-6 and opt.bf16
    assert (opt.adam_beta1, opt.adam_beta2, opt.adam_eps) == (0.9, 0.98, 1e-8)
    assert opt.weight_decay == 0.1 and opt.clip_grad == 1.0
    assert opt.use_distributed_optimizer and opt.optimizer_cpu_offload
    assert opt.optimizer_offload_fraction == 1.0 and opt.overlap_cpu_optimizer_d2h_h2d
    assert not opt.use_precision_aware_optimizer
    ddp = ddp_config_from_args(args)
    assert ddp.grad_reduce_in_fp32 and ddp.use_distributed_optimizer


@pytest.mark.skipif(importlib.util.find_spec("transformer_engine") is not None, reason="TE present")
def test_precision_aware_optimizer_without_te_names_the_flag():
    with pytest.raises(ImportError, match="--use-precision-aware-optimizer without --optimizer-cpu-offload"):
        optimizer_config_from_args(_args(QWEN3_30B_A3B, optimizer_cpu_offload=False))


def test_cpu_adam_is_accepted_on_a_gpu_machine_without_te():
    """CPU Adam (--optimizer-cpu-offload) steps torch's AdamW; megatron only reads TE's version,
    which te_absent's optimizer_te_version answers on GPU machines too, so it is not refused."""
    from slime.backends.megatron_utils.kernels import Kernels, check_precision_aware_optimizer

    gpu_without_te = Kernels(cuda=True, transformer_engine=False, apex_grad_accum=False)
    check_precision_aware_optimizer({"use_precision_aware_optimizer": True, "optimizer_cpu_offload": True},
                                    gpu_without_te)
    with pytest.raises(ImportError, match="without --optimizer-cpu-offload needs Transformer Engine"):
        check_precision_aware_optimizer({"use_precision_aware_optimizer": True, "optimizer_cpu_offload": False},
                                        gpu_without_te)



def test_tiny_configs_default_to_fp32_on_cpu():
    dense = transformer_config_from_args(_args(TINY_DENSE))
    assert dense.params_dtype == torch.float32 and not dense.bf16
    assert dense.num_moe_experts is None
    moe = transformer_config_from_args(_args(TINY_MOE))
    assert moe.num_moe_experts == 8 and moe.moe_layer_freq == [1, 1]
    assert moe.expert_model_parallel_size == 2
    opt = optimizer_config_from_args(_args(TINY_MOE, exp_avg_dtype="fp32"))
    assert opt.exp_avg_dtype == torch.float32 and not opt.bf16 and opt.params_dtype == torch.float32
    assert not ddp_config_from_args(_args(TINY_DENSE)).grad_reduce_in_fp32


def test_moe_layer_freq_forms():
    assert parse_moe_layer_freq(1, 4) == 1
    assert parse_moe_layer_freq("[0, 1, 1]", 3) == [0, 1, 1]
    assert parse_moe_layer_freq("[1]*2", 2) == [1, 1]
    assert parse_moe_layer_freq([1, 0], 2) == [1, 0]
    with pytest.raises(ValueError, match="--moe-layer-freq has 2 entries but --num-layers is 3"):
        parse_moe_layer_freq("[1, 1]", 3)


def _parse_script_args(script, extra):
    from slime.utils.arguments import megatron as megatron_domain
    from tests.unit.backends.megatron_utils.convert_util import model_args

    parser = argparse.ArgumentParser()
    megatron_domain.add_arguments(parser)
    args = parser.parse_args([*model_args(script), *extra])
    args.actor_num_nodes, args.actor_num_gpus_per_node = 1, 8
    megatron_domain.validate(args)
    return args


def _recipe_configs(repo_root, tmp_path, script):
    """The GPU run's three configs from ``scripts/<script>``'s flags, verbatim (Transformer Engine's
    probes answered as on the GPU machine when it is not installed here)."""
    from slime.backends.megatron_utils.kernels import Kernels
    from slime.backends.megatron_utils.config_check import transformer_engine_as_on_gpu
    from slime.utils.arguments import parse_args
    from tests.unit.tools.recipe_argv import recipe_argv

    entry, argv = recipe_argv(repo_root, script, tmp_path)
    args = parse_args(argv, entry=entry)
    gpu = Kernels.gpu_run()
    stand_in = transformer_engine_as_on_gpu() if importlib.util.find_spec("transformer_engine") is None else None
    with stand_in or contextlib.nullcontext():
        return (transformer_config_from_args(args, gpu), optimizer_config_from_args(args, gpu),
                ddp_config_from_args(args))


def test_configs_from_the_launch_scripts(repo_root, tmp_path):
    """The recipe's own flags (nothing added or dropped): CPU Adam with the precision-aware
    optimizer builds, which needs the distributed optimizer (gpu-first-contact trainer item 1)."""
    cfg, opt, ddp = _recipe_configs(repo_root, tmp_path, "run-qwen3-30B-A3B.sh")
    assert cfg.num_moe_experts == 128 and cfg.moe_layer_freq == [1] * 48 and cfg.moe_grouped_gemm
    assert cfg.num_query_groups == 4 and cfg.kv_channels == 128 and cfg.bf16 and cfg.moe_permute_fusion
    assert cfg.moe_token_dispatcher_type == "alltoall" and cfg.sequence_parallel
    assert cfg.apply_rope_fusion and cfg.gradient_accumulation_fusion and not cfg.use_cpu_initialization
    assert opt.use_distributed_optimizer and opt.optimizer_cpu_offload and opt.lr == 1e-6
    assert opt.use_precision_aware_optimizer and opt.optimizer_offload_fraction == 1.0
    assert ddp.grad_reduce_in_fp32 and ddp.use_distributed_optimizer
    tiny = _parse_script_args("qwen3-tiny-moe.sh", [])
    tiny_cfg = transformer_config_from_args(tiny)
    assert tiny_cfg.num_moe_experts == 8 and tiny_cfg.params_dtype == torch.float32
    assert tiny_cfg.moe_layer_freq == [1, 1] and tiny_cfg.num_query_groups == 2
    dense = transformer_config_from_args(_parse_script_args("qwen3-tiny.sh", []))
    assert dense.num_moe_experts is None and dense.ffn_hidden_size == 128


def test_layout_recompute_backend_and_expert_bias_flags_reach_the_config():
    from megatron.core.transformer.enums import AttnBackend

    cfg = transformer_config_from_args(_args(
        TINY_MOE, num_layers=4, moe_layer_freq=1, pipeline_model_parallel_size=2,
        decoder_first_pipeline_num_layers=1, decoder_last_pipeline_num_layers=3,
        recompute_granularity="selective", recompute_modules=["core_attn", "layernorm"],
        attention_backend="unfused", moe_router_score_function="sigmoid",
        moe_router_enable_expert_bias=True, moe_router_bias_update_rate=0.01))
    assert (cfg.num_layers_in_first_pipeline_stage, cfg.num_layers_in_last_pipeline_stage) == (1, 3)
    assert cfg.recompute_granularity == "selective" and cfg.recompute_modules == ["core_attn", "layernorm"]
    assert cfg.attention_backend is AttnBackend.unfused
    assert cfg.moe_router_enable_expert_bias and cfg.moe_router_bias_update_rate == 0.01


FUSIONS = ("masked_softmax_fusion", "bias_activation_fusion", "apply_rope_fusion", "gradient_accumulation_fusion")


def test_fusions_are_off_without_cuda_whatever_the_flags():
    from slime.backends.megatron_utils.kernels import fusion_fields as _fusion_fields

    assert _fusion_fields(_args(TINY_DENSE, position_embedding_type="rope")) == dict.fromkeys(FUSIONS, False)


@pytest.mark.parametrize("present", [True, False], ids=["kernels", "no_kernels"])
def test_fusions_on_gpu_default_on_and_each_no_flag_turns_one_off(monkeypatch, present, caplog):
    """GPU (CUDA reported available): every fusion is on by default when its kernel package is
    installed, a missing kernel turns it off with a warning, and each --no-*-fusion turns its one off."""
    from slime.backends.megatron_utils import kernels

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(kernels, "kernel_available", lambda module: present)
    base = dict(TINY_DENSE, position_embedding_type="rope", transformer_impl="transformer_engine")
    defaults = kernels.fusion_fields(_args(base))
    needs_kernel = {"apply_rope_fusion", "gradient_accumulation_fusion"}
    assert defaults == {f: present or f not in needs_kernel for f in FUSIONS}
    assert ("turned off" in caplog.text) == (not present)
    for dest, field in (("masked_softmax_fusion", "masked_softmax_fusion"), ("bias_swiglu_fusion", "bias_activation_fusion"),
                        ("apply_rope_fusion", "apply_rope_fusion"),
                        ("gradient_accumulation_fusion", "gradient_accumulation_fusion")):
        off = kernels.fusion_fields(_args(base, **{dest: False}))
        assert off == {**defaults, field: False}, dest


def test_recipe_feature_flags_reach_transformer_config():
    """Issue 13: the model-variant flags megatron-core has land on TransformerConfig."""
    cfg = transformer_config_from_args(_args(
        TINY_MOE, moe_shared_expert_intermediate_size=32, rotary_interleaved=True, attention_output_gate=True,
        apply_layernorm_1p=True, moe_shared_expert_gate=True, deterministic_mode=True))
    assert cfg.rotary_interleaved and cfg.attention_output_gate and cfg.layernorm_zero_centered_gamma
    assert cfg.moe_shared_expert_gate and cfg.deterministic_mode
    dense = transformer_config_from_args(_args(TINY_DENSE, moe_shared_expert_gate=True))
    assert dense.moe_shared_expert_gate is False  # an MoE-only field, dropped for dense models


def test_gpu_feature_fields_and_nan_check():
    from slime.backends.megatron_utils.config import _gpu_feature_fields

    assert _gpu_feature_fields(_args(TINY_MOE, fp8_format="hybrid", fp8_recipe="blockwise", moe_enable_deepep=True)) == {
        "fp8": "hybrid", "fp8_recipe": "blockwise", "moe_flex_dispatcher_backend": "deepep"}
    assert _gpu_feature_fields(_args(TINY_DENSE)) == {}
    assert ddp_config_from_args(_args(TINY_DENSE, check_for_nan_in_loss_and_grad=True)).check_for_nan_in_grad
    assert not ddp_config_from_args(_args(TINY_DENSE, check_for_nan_in_loss_and_grad=False)).check_for_nan_in_grad


def test_family_configs_from_the_tiny_scripts(repo_root, tmp_path):
    """MLA (MLATransformerConfig with YaRN), group-limited sigmoid routing with expert bias and
    shared experts reach megatron-core's config; GLM-4.5's partial rotary and QKV bias too."""
    from megatron.core.transformer import MLATransformerConfig

    ds = transformer_config_from_args(_parse_script_args("deepseek-v3-tiny.sh", []))
    assert isinstance(ds, MLATransformerConfig) and ds.multi_latent_attention
    assert (ds.q_lora_rank, ds.kv_lora_rank, ds.qk_head_dim, ds.qk_pos_emb_head_dim, ds.v_head_dim) == (32, 32, 16, 8, 16)
    assert ds.rope_type == "yarn" and ds.rotary_scaling_factor == 4.0 and ds.original_max_position_embeddings == 128
    assert ds.mscale == 1.0 and ds.mscale_all_dim == 1.0 and ds.beta_fast == 32.0 and ds.rotary_base == 10000.0
    assert ds.moe_router_score_function == "sigmoid" and ds.moe_router_enable_expert_bias
    assert ds.moe_router_num_groups == 4 and ds.moe_router_group_topk == 1
    assert ds.moe_router_topk_scaling_factor == 2.5 and ds.moe_router_bias_update_rate == 0.0
    assert ds.moe_shared_expert_intermediate_size == 32 and ds.moe_layer_freq == [0, 1]
    plain = _recipe_configs(repo_root, tmp_path, "run-moonlight-16B-A3B.sh")[0]
    assert plain.q_lora_rank is None and plain.rope_type == "rope" and not plain.apply_rope_fusion
    assert plain.moe_permute_fusion and plain.moe_grouped_gemm
    glm = transformer_config_from_args(_parse_script_args("glm4.5-tiny.sh", []))
    assert not glm.multi_latent_attention and glm.add_qkv_bias and glm.qk_layernorm
    assert glm.moe_router_enable_expert_bias and glm.moe_router_num_groups is None


@pytest.mark.parametrize("script, extra, message", [
    ("glm4.5-tiny.sh", ["--moe-router-num-groups", "4"], "go together"),
    ("glm4.5-tiny.sh", ["--moe-router-num-groups", "3", "--moe-router-group-topk", "1"], "must divide --num-experts 8"),
    ("glm4.5-tiny.sh", ["--moe-router-num-groups", "4", "--moe-router-group-topk", "3"],
     "must be in 1..--moe-router-num-groups"),
    ("deepseek-v3-tiny.sh", ["--kv-lora-rank", "0"], "--kv-lora-rank must be > 0"),
])
def test_family_flag_validation_names_the_flag(script, extra, message):
    from slime.utils.arguments.common import ArgumentError

    with pytest.raises(ArgumentError, match=message):
        _parse_script_args(script, extra)


def test_gradient_accumulation_fusion_needs_apex_even_with_transformer_engine(monkeypatch, caplog):
    """gpu-first-contact trainer item 3: with TE but without apex's fused_weight_gradient_mlp_cuda
    the fusion is off with a warning (GPTModel's output layer, megatron's ColumnParallelLinear,
    raises at construction without that module whatever --transformer-impl)."""
    from slime.backends.megatron_utils import kernels

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(kernels, "kernel_available", lambda module: module == "transformer_engine")
    fields = kernels.fusion_fields(_args(TINY_DENSE, position_embedding_type="rope",
                                         transformer_impl="transformer_engine"))
    assert fields["apply_rope_fusion"] and not fields["gradient_accumulation_fusion"]
    assert ("gradient_accumulation_fusion: apex's fused_weight_gradient_mlp_cuda is not installed; turned off "
            "(pass --no-gradient-accumulation-fusion to silence this)") in caplog.text
    assert kernels.fusion_fields(_args(TINY_DENSE), kernels.Kernels.gpu_run())["gradient_accumulation_fusion"]
