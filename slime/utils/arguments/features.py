"""Features domain: the Megatron-LM and slime flags of slime's larger recipes (GLM-4, Qwen3-Next,
DeepSeek/Kimi, FP8/INT4 variants) beyond the core model shape: a user layer spec (``--spec``),
layer variants megatron-core builds, FP8 training, DeepEP, MTP, log-prob chunking and data padding.

Flags megatron-core has go into ``TransformerConfig`` (``config.py``). Flags that need a GPU are
accepted and validated here, listed by ``gpu_only_flags`` (the ``--dry-run`` plan shows them) and
refused at start-up without CUDA by ``startup_refusals``, one line naming the flag and why.
"""

from __future__ import annotations

import argparse
import importlib.util

from slime.utils.arguments.common import require

FP8_FORMATS = ("e4m3", "hybrid")
FP8_RECIPES = ("tensorwise", "delayed", "mxfp8", "blockwise")

# (flag, dest, help) of store_true switches that megatron-core's TransformerConfig has.
_CONFIG_SWITCHES = (
    ("--rotary-interleaved", "rotary_interleaved",
     "Rotate interleaved pairs (x0,x1),(x2,x3)... instead of the two halves (GLM-4's RoPE)."),
    ("--attention-output-gate", "attention_output_gate",
     "Sigmoid gate on the attention output, computed from the input by the QKV projection (Qwen3-Next)."),
    ("--use-gated-attention", "attention_output_gate",
     "slime's Qwen3-Next spelling of --attention-output-gate (same switch)."),
    ("--apply-layernorm-1p", "apply_layernorm_1p",
     "Zero-centred norm weights: the norm scales by (1 + weight) (layernorm_zero_centered_gamma)."),
    ("--moe-shared-expert-gate", "moe_shared_expert_gate",
     "Sigmoid gate on the shared expert's output (Qwen2/3-MoE-style shared experts)."),
    ("--deterministic-mode", "deterministic_mode",
     "Ask megatron-core for deterministic kernels (TransformerConfig.deterministic_mode)."),
)
# (flag, help) of switches read by a --spec layer spec; megatron-core 0.16's GPT specs have none.
SPEC_SWITCHES = (
    ("--post-self-attn-layernorm", "Norm on the attention output before the residual add (GLM-4); "
     "built by the --spec layer spec, which reads args.post_self_attn_layernorm."),
    ("--post-mlp-layernorm", "Norm on the MLP output before the residual add (GLM-4); built by the "
     "--spec layer spec, which reads args.post_mlp_layernorm."),
)


def _add_model(group) -> None:
    add = group.add_argument
    add("--spec", nargs=2, metavar=("MODULE", "FUNCTION"), default=None,
        help="User layer spec, loaded as slime does: getattr(importlib.import_module(MODULE), FUNCTION) is "
             "either a megatron ModuleSpec / block spec used as is, or called as FUNCTION(args, config, "
             "vp_stage) to return one; it replaces the --transformer-impl spec.")
    add("--no-position-embedding", dest="add_position_embedding", action="store_false", default=True,
        help="Megatron-LM's legacy switch for no learned absolute position embedding: accepted with "
             "--position-embedding-type rope or none (which have none); refused with learned_absolute.")
    for flag, dest, help_text in _CONFIG_SWITCHES:
        add(flag, dest=dest, action="store_true", default=False, help=help_text)
    for flag, help_text in SPEC_SWITCHES:
        add(flag, action="store_true", default=False, help=help_text)
    add("--no-check-for-nan-in-loss-and-grad", dest="check_for_nan_in_loss_and_grad", action="store_false",
        default=True, help="Do not stop on a NaN/Inf training loss or gradient (checked by default, as in "
                           "Megatron-LM: the loss of every micro-batch and megatron's DDP gradient buffers).")
    add("--enable-experimental", action="store_true", default=False,
        help="Turn on megatron-core's experimental features (megatron.core.config.set_experimental_flag).")


def _add_gpu(group) -> None:
    add = group.add_argument
    add("--fp8-format", choices=FP8_FORMATS, default=None,
        help="FP8 training with Transformer Engine: e4m3 everywhere, or hybrid (e4m3 forward, e5m2 "
             "gradients). GPU only (needs --transformer-impl transformer_engine).")
    add("--fp8-recipe", choices=FP8_RECIPES, default="delayed",
        help="FP8 scaling recipe with --fp8-format (Megatron-LM's default delayed).")
    add("--moe-enable-deepep", action="store_true", default=False,
        help="DeepEP all-to-all for the MoE flex token dispatcher (needs --moe-token-dispatcher-type flex). "
             "GPU only.")
    add("--allgather-cp", action="store_true", default=False,
        help="slime's all-gather context parallelism (contiguous sequence chunks, K/V all-gathered). This "
             "trainer implements only Transformer Engine's load-balanced ring layout: refused at start-up "
             "with --context-parallel-size > 1; no effect with CP 1.")


def _add_mtp(group) -> None:
    add = group.add_argument
    add("--mtp-num-layers", type=int, default=None,
        help="Multi-token-prediction layers after the decoder (DeepSeek-V3/GLM-4.5-style MTP). Validated and "
             "shown by --dry-run; refused at start-up (megatron-core 0.16's GPTModel returns a loss instead of "
             "logits when it runs MTP). None: no MTP block.")
    add("--enable-mtp-training", action="store_true", default=False,
        help="Train the MTP layers with their loss (needs --mtp-num-layers); without it they are frozen.")
    add("--mtp-loss-scaling-factor", type=float, default=0.1,
        help="Weight of the MTP loss (averaged over the MTP layers) added to the training loss.")


def _add_slime(group) -> None:
    add = group.add_argument
    add("--log-probs-chunk-size", type=int, default=-1,
        help="Compute log-probs and entropy over the vocabulary this many tokens at a time, bounding the "
             "fp32 [tokens, vocab] temporaries of one micro-batch (-1: all tokens at once).")
    add("--data-pad-size-multiplier", type=int, default=None,
        help="Pad each packed micro-batch row to a multiple of TP x this (slime pads to TP x 128 by default "
             "for its THD kernels). None: only the padding this trainer's kernels need (TP under sequence "
             "parallel, 2 x CP); padding is a separate segment and never changes the results.")
    add("--model-name", type=str, default=None,
        help="slime's name of the model family for the Megatron <-> HF weight conversion (e.g. qwen3, qwen3moe, "
             "or the HF config class name). This trainer picks the converter from the checkpoint's "
             "architectures; a --model-name that names another family is refused at parse time.")


def model_family_name(name: str) -> str:
    """slime's model-name matching key: lower case without separators and without the class-name
    suffixes, so Qwen3MoeForCausalLM, Qwen3MoeConfig, qwen3_moe and qwen3moe all read qwen3moe."""
    key = name.lower().replace("-", "").replace("_", "")
    for suffix in ("forcausallm", "forconditionalgeneration", "config", "model"):
        if key.endswith(suffix) and len(key) > len(suffix):
            key = key[: -len(suffix)]
    return key


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the recipe feature flags as one argument group."""
    group = parser.add_argument_group("features", "Layer spec, model variants, FP8, DeepEP, MTP, log-prob "
                                      "chunking (flags of slime's larger recipes).")
    _add_model(group)
    _add_gpu(group)
    _add_mtp(group)
    _add_slime(group)


def gpu_only_flags(args: argparse.Namespace) -> list[tuple[str, str]]:
    """(flag, what it needs) for every GPU-only feature turned on: the --dry-run plan shows them and
    `startup_refusals` refuses them without CUDA."""
    found = []
    if getattr(args, "fp8_format", None):
        found.append((f"--fp8-format {args.fp8_format} --fp8-recipe {args.fp8_recipe}",
                      "Transformer Engine FP8 GEMMs (CUDA)"))
    if getattr(args, "moe_enable_deepep", False):
        found.append(("--moe-enable-deepep", "DeepEP all-to-all kernels (CUDA, NVSHMEM)"))
    return found


def startup_refusals(args: argparse.Namespace, cuda_available: bool) -> list[str]:
    """One line per flag this run cannot honor: GPU-only features without CUDA, and features this
    trainer does not implement in the requested configuration. The entry points refuse to start on
    any; the --dry-run plan lists them (those independent of the machine as refused)."""
    refusals = []
    if not cuda_available:
        refusals += [f"{flag}: needs {need}; this machine has no CUDA device" for flag, need in gpu_only_flags(args)]
    if getattr(args, "allgather_cp", False) and args.context_parallel_size > 1:
        refusals.append(f"--allgather-cp with --context-parallel-size {args.context_parallel_size}: this trainer "
                        "splits sequences only in Transformer Engine's load-balanced ring layout (2 x CP chunks "
                        "per sequence); the all-gather layout is not implemented, drop --allgather-cp")
    if getattr(args, "mtp_num_layers", None):
        refusals.append(f"--mtp-num-layers {args.mtp_num_layers}: not implemented: megatron-core 0.16's GPTModel "
                        "runs its MTP block only when given labels, and then returns the loss instead of the "
                        "logits this trainer's RL and SFT losses need, so the model provider builds no MTP "
                        "block; drop --mtp-num-layers / --enable-mtp-training")
    return refusals


def _check_spec(args: argparse.Namespace, warnings: list[str]) -> None:
    if args.spec is None:
        for flag, _ in SPEC_SWITCHES:
            require(not getattr(args, flag[2:].replace("-", "_")),
                    f"{flag} needs a --spec MODULE FUNCTION layer spec that builds it: megatron-core's GPT "
                    "layer specs have no post-attention / post-MLP norm (slime's GLM-4 recipes pass "
                    "--spec slime_plugins.models.glm4 get_glm_spec)")
        return
    module = args.spec[0]
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        message = f"--spec {module} {args.spec[1]}: module {module!r} is not importable"
        require(getattr(args, "dry_run", False), message)
        warnings.append(message + " (ignored by --dry-run)")


def _check_gpu(args: argparse.Namespace, warnings: list[str]) -> None:
    if args.fp8_format:
        require(args.transformer_impl == "transformer_engine",
                f"--fp8-format {args.fp8_format} needs --transformer-impl transformer_engine (FP8 GEMMs are "
                f"Transformer Engine's), got {args.transformer_impl}")
    elif args.fp8_recipe != "delayed":
        warnings.append(f"--fp8-recipe {args.fp8_recipe} has no effect without --fp8-format")
    if args.moe_enable_deepep:
        require(args.num_experts, "--moe-enable-deepep needs an MoE model (--num-experts)")
        require(args.moe_token_dispatcher_type == "flex",
                f"--moe-enable-deepep needs --moe-token-dispatcher-type flex, got {args.moe_token_dispatcher_type}")
    if args.allgather_cp and args.context_parallel_size == 1:
        warnings.append("--allgather-cp has no effect with --context-parallel-size 1")


def _check_model(args: argparse.Namespace) -> None:
    if not args.add_position_embedding:
        require(args.position_embedding_type in ("rope", "none"),
                "--no-position-embedding is Megatron-LM's deprecated switch; with --position-embedding-type "
                "learned_absolute give --position-embedding-type none instead")
    if args.apply_layernorm_1p:
        require(args.normalization == "RMSNorm" or args.transformer_impl == "transformer_engine",
                "--apply-layernorm-1p with --normalization LayerNorm needs --transformer-impl "
                "transformer_engine (the local LayerNorm has no zero-centred weight)")


def _check_mtp(args: argparse.Namespace) -> None:
    if args.mtp_num_layers is not None:
        require(args.mtp_num_layers >= 1, f"--mtp-num-layers must be >= 1, got {args.mtp_num_layers}")
    require(not args.enable_mtp_training or args.mtp_num_layers,
            "--enable-mtp-training needs --mtp-num-layers (the MTP layers to train)")
    require(args.mtp_loss_scaling_factor >= 0,
            f"--mtp-loss-scaling-factor must be >= 0, got {args.mtp_loss_scaling_factor}")


def validate(args: argparse.Namespace) -> list[str]:
    """--spec MODULE must be importable (a warning under --dry-run); --post-self-attn-layernorm and
    --post-mlp-layernorm need --spec; --no-position-embedding needs rope or none; --apply-layernorm-1p
    with LayerNorm needs Transformer Engine; --fp8-format needs --transformer-impl transformer_engine;
    --moe-enable-deepep needs --num-experts and --moe-token-dispatcher-type flex; --enable-mtp-training
    needs --mtp-num-layers >= 1; --mtp-loss-scaling-factor >= 0; --log-probs-chunk-size is -1 or >= 1;
    --data-pad-size-multiplier >= 1; --model-name non-empty (checked against the HF config with it)."""
    warnings: list[str] = []
    _check_spec(args, warnings)
    _check_model(args)
    _check_gpu(args, warnings)
    _check_mtp(args)
    chunk = args.log_probs_chunk_size
    require(chunk == -1 or chunk >= 1, f"--log-probs-chunk-size must be -1 (off) or >= 1, got {chunk}")
    pad = args.data_pad_size_multiplier
    require(pad is None or pad >= 1, f"--data-pad-size-multiplier must be >= 1, got {pad}")
    require(args.model_name is None or args.model_name.strip() != "", "--model-name must not be empty")
    return warnings
