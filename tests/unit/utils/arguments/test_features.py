"""Issue 13: the flags of slime's larger recipes parse, validate, show in the --dry-run plan and are
refused at start-up, naming the flag, where this machine or trainer cannot honor them."""

import shlex

import pytest
import torch

from slime.utils.arguments import ArgumentError, parse_args, startup_refusals

# slime's scripts/models/glm4-9B.sh and qwen3-next-80B-A3B.sh MODEL_ARGS (their --spec plugins are
# slime's own package, not installed here: --dry-run warns, a real start would need it).
GLM4_9B = """--spec slime_plugins.models.glm4 get_glm_spec --swiglu --num-layers 40 --hidden-size 4096
  --ffn-hidden-size 13696 --num-attention-heads 32 --group-query-attention --num-query-groups 2
  --use-rotary-position-embeddings --disable-bias-linear --add-qkv-bias --normalization RMSNorm
  --norm-epsilon 1e-5 --rotary-base 10000 --vocab-size 151552 --post-self-attn-layernorm --post-mlp-layernorm
  --rotary-interleaved --rotary-percent 0.5 --no-rope-fusion --untie-embeddings-and-output-weights
  --no-position-embedding"""
QWEN3_NEXT = """--spec slime_plugins.models.qwen3_next get_qwen3_next_spec --disable-bias-linear --qk-layernorm
  --group-query-attention --num-attention-heads 16 --num-query-groups 2 --kv-channels 256 --num-layers 48
  --hidden-size 2048 --ffn-hidden-size 5120 --normalization RMSNorm --apply-layernorm-1p
  --position-embedding-type rope --norm-epsilon 1e-6 --rotary-percent 0.25 --swiglu
  --untie-embeddings-and-output-weights --vocab-size 151936 --rotary-base 10000000 --moe-ffn-hidden-size 512
  --moe-shared-expert-intermediate-size 512 --moe-router-score-function softmax --moe-token-dispatcher-type flex
  --moe-router-topk 10 --moe-layer-freq [1]*48 --num-experts 512 --moe-grouped-gemm --moe-router-dtype fp32
  --moe-aux-loss-coeff 0 --attention-output-gate --use-gated-attention --moe-shared-expert-gate
  --moe-enable-deepep --fp8-format e4m3 --fp8-recipe blockwise --deterministic-mode --enable-experimental
  --no-check-for-nan-in-loss-and-grad --allgather-cp --log-probs-chunk-size 1024 --data-pad-size-multiplier 64
  --sglang-expert-parallel-size 2 --rollout-num-gpus-per-engine 2 --no-offload-train"""
SFT = ("--loss-type sft_loss --disable-compute-advantages-and-returns --loss-mask-type qwen3 "
       "--calculate-per-token-loss")


def _argv(base_argv, text):
    return base_argv + shlex.split(text)


@pytest.mark.parametrize("model", [GLM4_9B, QWEN3_NEXT], ids=["glm4-9B", "qwen3-next"])
def test_recipe_model_args_dry_run_and_show_in_plan(base_argv, model, capsys):
    from train import main

    assert main(_argv(base_argv, model + " " + SFT) + ["--dry-run"]) == 0
    out = capsys.readouterr().out
    plan = out[out.index("== Features"):out.index("== Warnings")]
    assert "--spec" in plan and "(args, config, vp_stage) builds the layers" in plan
    assert "module 'slime_plugins' is not importable" not in plan  # a warning, not a feature row
    if model is QWEN3_NEXT:
        assert "--fp8-format e4m3 --fp8-recipe blockwise: GPU only" in plan
        assert "--moe-enable-deepep" in plan and "GPU only: DeepEP" in plan
        assert "--sglang-ep-size 2" in out or "--ep-size 2" in out  # the alias reached the launch line
    assert "is not importable (ignored by --dry-run)" in out


def test_recipe_flags_land_on_their_dests(base_argv):
    args = parse_args(_argv(base_argv, QWEN3_NEXT + " " + SFT + " --dry-run"))
    assert args.attention_output_gate and args.apply_layernorm_1p and args.moe_shared_expert_gate
    assert (args.fp8_format, args.fp8_recipe, args.moe_enable_deepep) == ("e4m3", "blockwise", True)
    assert args.check_for_nan_in_loss_and_grad is False and args.deterministic_mode and args.enable_experimental
    assert (args.log_probs_chunk_size, args.data_pad_size_multiplier, args.sglang_ep_size) == (1024, 64, 2)
    assert (args.offload_train, args.offload_rollout) == (False, True)  # --colocate, --no-offload-train
    assert args.disable_compute_advantages_and_returns and args.loss_mask_type == "qwen3"
    glm = parse_args(_argv(base_argv, GLM4_9B + " --dry-run"))
    assert glm.post_self_attn_layernorm and glm.post_mlp_layernorm and glm.rotary_interleaved
    assert glm.add_position_embedding is False and glm.spec == ["slime_plugins.models.glm4", "get_glm_spec"]


def test_gpu_only_and_unimplemented_flags_are_refused_at_start_up(base_argv):
    args = parse_args(_argv(base_argv, QWEN3_NEXT + " --context-parallel-size 2 --mtp-num-layers 1 --dry-run"))
    refusals = startup_refusals(args, cuda_available=False)
    assert [r.split(":")[0] for r in refusals] == [
        "--fp8-format e4m3 --fp8-recipe blockwise", "--moe-enable-deepep", "--allgather-cp with "
        "--context-parallel-size 2", "--mtp-num-layers 1"]
    assert all("this machine has no CUDA device" in r for r in refusals[:2])
    assert len(startup_refusals(args, cuda_available=True)) == 2  # CUDA lifts only the GPU-only ones


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_entry_point_refuses_gpu_only_flag_on_cpu_in_one_line(base_argv, capsys):
    from train import main

    assert main(_argv(base_argv, "--num-experts 4 --moe-token-dispatcher-type flex --moe-enable-deepep")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["train.py: error: --moe-enable-deepep: needs DeepEP all-to-all kernels (CUDA, NVSHMEM); "
                   "this machine has no CUDA device"]


@pytest.mark.parametrize("extra, message", [
    ("--post-mlp-layernorm", "--post-mlp-layernorm needs a --spec MODULE FUNCTION layer spec"),
    ("--no-position-embedding", "--no-position-embedding is Megatron-LM's deprecated switch"),
    ("--fp8-format hybrid --transformer-impl local", "--fp8-format hybrid needs --transformer-impl transformer_engine"),
    ("--moe-enable-deepep", "--moe-enable-deepep needs an MoE model"),
    ("--num-experts 4 --moe-enable-deepep", "--moe-enable-deepep needs --moe-token-dispatcher-type flex"),
    ("--enable-mtp-training", "--enable-mtp-training needs --mtp-num-layers"),
    ("--mtp-num-layers 0", "--mtp-num-layers must be >= 1"),
    ("--log-probs-chunk-size 0", "--log-probs-chunk-size must be -1"),
    ("--data-pad-size-multiplier 0", "--data-pad-size-multiplier must be >= 1"),
    ("--apply-layernorm-1p --transformer-impl local", "--apply-layernorm-1p with --normalization LayerNorm"),
    ("--spec no_such_module_xyz fn", "--spec no_such_module_xyz fn: module 'no_such_module_xyz' is not importable"),
    ("--disable-compute-advantages-and-returns", "--disable-compute-advantages-and-returns leaves no advantages"),
    ("--disable-compute-advantages-and-returns --loss-type sft_loss --advantage-estimator ppo",
     "leaves the critic without returns"),
])
def test_invalid_combinations_name_the_flag(base_argv, extra, message):
    with pytest.raises(ArgumentError, match=message):
        parse_args(_argv(base_argv, extra))


def test_warnings_for_flags_without_effect(base_argv):
    args = parse_args(_argv(base_argv, "--fp8-recipe mxfp8 --allgather-cp"))
    assert "--fp8-recipe mxfp8 has no effect without --fp8-format" in args.warnings
    assert "--allgather-cp has no effect with --context-parallel-size 1" in args.warnings


def test_lone_eval_prompt_data_is_named_aime(base_argv, tmp_path):
    """slime: a single --eval-prompt-data PATH is the dataset "aime"."""
    data = tmp_path / "eval.jsonl"
    data.write_text('{"input": "1+1"}\n')
    args = parse_args(base_argv + ["--eval-interval", "1", "--eval-prompt-data", str(data)])
    assert args.eval_prompt_data == ["aime", str(data)]
    assert [(d.name, d.path) for d in args.eval_datasets] == [("aime", str(data))]


def test_offload_flags_have_no_forms(base_argv):
    """slime's --offload-train / --offload-rollout are BooleanOptionalAction: --no-X wins over
    --colocate's default, --X turns one on without --offload."""
    args = parse_args(base_argv + ["--no-offload-rollout"])
    assert (args.offload_train, args.offload_rollout) == (True, False)
    no_colocate = [w for w in base_argv if w != "--colocate"] + ["--debug-train-only", "--offload-train"]
    args = parse_args(no_colocate)
    assert (args.offload_train, args.offload_rollout) == (True, False)


@pytest.mark.parametrize("name, ok", [("qwen3", True), ("Qwen3Config", True), ("qwen3moe", False), ("glm4", False)])
def test_model_name_must_name_the_checkpoint_family(base_argv, name, ok):
    """slime's --model-name picks the weight converter; here the architecture does, so another
    family is refused naming both (by the entry points' model check)."""
    import json
    from pathlib import Path

    from slime.models import validate_hf_checkpoint

    hf_dir = Path(base_argv[base_argv.index("--hf-checkpoint") + 1])
    (hf_dir / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"]}))
    argv = base_argv + ["--model-name", name]
    if ok:
        assert parse_args(argv, model_check=validate_hf_checkpoint).model_name == name
    else:
        with pytest.raises(ArgumentError, match=f"--model-name {name} names another model family than HF config "
                                                "architectures=Qwen3ForCausalLM"):
            parse_args(argv, model_check=validate_hf_checkpoint)
