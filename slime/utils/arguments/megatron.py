"""Megatron domain: the Megatron-LM vocabulary for model shape, MoE, parallel layout, recompute,
optimizer, precision and fusions, with Megatron-LM's flag names, dests and defaults, plus the
Megatron plugin paths. Validation checks the parallel layout against the actor's world size.

To add flags: append a tuple to one of the tables or a call to one of the ``_add_*`` helpers.
"""

from __future__ import annotations

import argparse

from slime.utils.arguments.common import ArgumentError, require, world_size
from slime.utils.arguments.moe_layer_freq import parse_moe_layer_freq

# (flag, help) of plain store_true switches, grouped by topic.
_MODEL_SWITCHES = (
    ("--group-query-attention", "Use grouped-query attention with --num-query-groups KV heads."),
    ("--swiglu", "SwiGLU MLP activation."),
    ("--qk-layernorm", "Normalise queries and keys per head."),
    ("--add-qkv-bias", "Bias in the QKV projection only (Qwen2-style), even with --disable-bias-linear."),
    ("--untie-embeddings-and-output-weights", "Separate input embedding and output layer weights."),
    ("--use-rotary-position-embeddings", "Legacy spelling of --position-embedding-type rope."),
)
_MOE_SWITCHES = (
    ("--moe-grouped-gemm", "Run the local experts as one grouped GEMM."),
    ("--moe-permute-fusion", "Fused token permutation in the dispatcher."),
    ("--moe-router-pre-softmax", "Softmax before top-k in the router."),
    ("--moe-router-enable-expert-bias", "Aux-loss-free load balancing with a per-expert bias."),
)
_TRAIN_SWITCHES = (
    ("--sequence-parallel", "Sequence parallelism inside tensor-parallel regions (needs TP > 1)."),
    ("--optimizer-cpu-offload", "Keep optimizer state and run the optimizer step on the CPU."),
    ("--overlap-cpu-optimizer-d2h-h2d", "Overlap device<->host copies of the CPU optimizer."),
    ("--use-precision-aware-optimizer", "Optimizer keeps main params and moments in the dtypes below."),
    ("--overlap-grad-reduce", "Overlap the gradient reduce-scatter with backward."),
    ("--overlap-param-gather", "Overlap the parameter all-gather with forward."),
    ("--accumulate-allreduce-grads-in-fp32", "Accumulate and all-reduce gradients in fp32."),
    ("--attention-softmax-in-fp32", "Compute the attention softmax in fp32."),
    ("--bf16", "Train in bfloat16."),
    ("--fp16", "Train in float16."),
    ("--calculate-per-token-loss", "Average the loss over tokens instead of micro-batches."),
)
# Megatron-LM's --no-* fusion switches store False into the positive dest.
_FUSION_OFF = (
    ("--no-masked-softmax-fusion", "masked_softmax_fusion", "Disable the fused masked softmax."),
    ("--no-gradient-accumulation-fusion", "gradient_accumulation_fusion", "Disable fused weight-grad accumulation."),
    ("--no-bias-swiglu-fusion", "bias_swiglu_fusion", "Disable the fused bias + SwiGLU."),
    ("--no-rope-fusion", "apply_rope_fusion", "Disable the fused rotary embedding."),
)
_DTYPE_CHOICES = {
    "--main-grads-dtype": ("fp32", "bf16"),
    "--main-params-dtype": ("fp32", "fp16"),
    "--exp-avg-dtype": ("fp32", "fp16", "bf16", "fp8"),
    "--exp-avg-sq-dtype": ("fp32", "fp16", "bf16", "fp8"),
}


def _switches(group, table) -> None:
    for flag, help_text in table:
        group.add_argument(flag, action="store_true", default=False, help=help_text)


def _add_model(group) -> None:
    add = group.add_argument
    add("--num-layers", type=int, default=None, help="Number of transformer layers.")
    add("--hidden-size", type=int, default=None, help="Transformer hidden size.")
    add("--ffn-hidden-size", type=int, default=None, help="Dense MLP hidden size (None: 4 x hidden, 8/3 with swiglu).")
    add("--num-attention-heads", type=int, default=None, help="Attention heads.")
    add("--num-query-groups", type=int, default=1, help="KV heads with --group-query-attention.")
    add("--kv-channels", type=int, default=None, help="Head dimension (None: hidden / heads).")
    add("--normalization", choices=("LayerNorm", "RMSNorm"), default="LayerNorm", help="Norm layer type.")
    add("--norm-epsilon", type=float, default=1e-5, help="Epsilon of the norm layers.")
    add("--position-embedding-type", choices=("learned_absolute", "rope", "none"), default="learned_absolute",
        help="Position embedding.")
    add("--rotary-base", type=int, default=10000, help="Rotary embedding base (HF rope_theta).")
    add("--rotary-percent", type=float, default=1.0, help="Fraction of the head dimension that is rotated.")
    add("--disable-bias-linear", dest="add_bias_linear", action="store_false", default=True,
        help="No biases in linear layers (sets add_bias_linear=False).")
    add("--vocab-size", type=int, default=None, help="Vocabulary size before padding.")
    add("--make-vocab-size-divisible-by", type=int, default=128, help="Pad the vocabulary to a multiple of this.")
    add("--max-position-embeddings", type=int, default=None, help="Maximum sequence length of position embeddings.")
    add("--seq-length", type=int, default=None, help="Training sequence length (Megatron bookkeeping).")
    add("--init-method-std", type=float, default=0.02, help="Std of the normal weight initialisation.")
    add("--attention-dropout", type=float, default=0.1, help="Dropout on attention probabilities.")
    add("--hidden-dropout", type=float, default=0.1, help="Dropout on hidden states.")
    _switches(group, _MODEL_SWITCHES)


def _add_moe(group) -> None:
    add = group.add_argument
    add("--num-experts", type=int, default=None, help="Routed experts per MoE layer (None: dense model).")
    add("--moe-ffn-hidden-size", type=int, default=None, help="Expert MLP hidden size (None: --ffn-hidden-size).")
    add("--moe-router-topk", type=int, default=2, help="Experts per token.")
    add("--moe-router-score-function", choices=("softmax", "sigmoid"), default="softmax", help="Router scores.")
    add("--moe-layer-freq", type=parse_moe_layer_freq, default=1,
        help="MoE layer pattern: an int k (every k-th layer is MoE) or a list such as [1,1,0] or [1]*48.")
    add("--moe-token-dispatcher-type", choices=("allgather", "alltoall", "flex"), default="allgather",
        help="Token dispatcher.")
    add("--moe-router-dtype", choices=("fp32", "fp64"), default=None, help="Router compute dtype (None: model).")
    add("--moe-aux-loss-coeff", type=float, default=0.0, help="Load-balancing auxiliary loss weight.")
    add("--moe-token-drop-policy", choices=("probs", "position"), default="probs",
        help="Which tokens are dropped when capacity is exceeded.")
    add("--moe-router-load-balancing-type", choices=("aux_loss", "seq_aux_loss", "none"), default="aux_loss",
        help="Load-balancing strategy.")
    add("--moe-shared-expert-intermediate-size", type=int, default=None, help="Shared expert hidden size.")
    add("--moe-router-bias-update-rate", type=float, default=1e-3, help="Expert-bias update rate.")
    _switches(group, _MOE_SWITCHES)


def _add_parallel(group) -> None:
    add = group.add_argument
    add("--tensor-model-parallel-size", type=int, default=1, help="Tensor parallel size (TP).")
    add("--pipeline-model-parallel-size", type=int, default=1, help="Pipeline parallel size (PP).")
    add("--decoder-first-pipeline-num-layers", type=int, default=None, help="Layers on the first PP stage.")
    add("--decoder-last-pipeline-num-layers", type=int, default=None, help="Layers on the last PP stage.")
    add("--context-parallel-size", type=int, default=1,
        help="Context parallel size (CP): each sequence split in 2*CP chunks, rank i holding chunks i and "
             "2*CP-1-i (needs --transformer-impl transformer_engine, GPU).")
    add("--expert-model-parallel-size", type=int, default=1, help="Expert parallel size (EP).")
    add("--expert-tensor-parallel-size", type=int, default=None, help="Expert tensor parallel size (None: = TP).")
    add("--recompute-granularity", choices=("full", "selective"), default=None, help="Activation recompute.")
    add("--recompute-method", choices=("uniform", "block"), default=None, help="Full recompute layer split.")
    add("--recompute-num-layers", type=int, default=None, help="Layers per recompute unit (uniform) or stage (block).")
    add("--recompute-modules", nargs="*", type=str, default=None, help="Modules recomputed with selective.")
    add("--distributed-backend", choices=("nccl", "gloo"), default="nccl", help="torch.distributed backend.")
    add("--distributed-timeout-minutes", type=int, default=10, help="Collective timeout in minutes.")
    add("--seed", type=int, default=1234, help="Random seed of the trainer.")
    add("--transformer-impl", choices=("local", "transformer_engine"), default="transformer_engine",
        help="Layer implementation.")
    add("--attention-backend", choices=("flash", "fused", "unfused", "local", "auto"), default="auto",
        help="Attention kernel.")


def _add_optimizer(group) -> None:
    add = group.add_argument
    add("--optimizer", choices=("adam", "sgd"), default="adam", help="Optimizer.")
    add("--lr", type=float, default=None, help="Peak learning rate.")
    add("--min-lr", type=float, default=0.0, help="Minimum learning rate of the decay.")
    add("--lr-decay-style", choices=("constant", "linear", "cosine", "inverse-square-root", "WSD"),
        default="linear", help="Learning-rate decay.")
    add("--lr-warmup-iters", type=int, default=0, help="Warm-up steps.")
    add("--lr-warmup-fraction", type=float, default=None, help="Warm-up as a fraction of decay steps.")
    add("--lr-decay-iters", type=int, default=None, help="Decay steps (None: --train-iters).")
    add("--train-iters", type=int, default=None, help="Total optimizer steps for the scheduler.")
    add("--weight-decay", type=float, default=0.01, help="Weight decay.")
    add("--adam-beta1", type=float, default=0.9, help="Adam beta1.")
    add("--adam-beta2", type=float, default=0.999, help="Adam beta2.")
    add("--adam-eps", type=float, default=1e-8, help="Adam epsilon.")
    add("--clip-grad", type=float, default=1.0, help="Gradient-norm clip.")
    add("--optimizer-offload-fraction", type=float, default=1.0,
        help="Fraction of optimizer state on the CPU with --optimizer-cpu-offload.")
    for flag, choices in _DTYPE_CHOICES.items():
        add(flag, choices=choices, default="fp32", help=f"{flag[2:]} with --use-precision-aware-optimizer.")
    _switches(group, _TRAIN_SWITCHES)
    # slime always trains with the distributed optimizer (megatron-core's precision-aware optimizer,
    # which every MoE recipe uses with CPU Adam, asserts it); the flag stays accepted.
    group.add_argument("--use-distributed-optimizer", action="store_true", default=True,
                       help="Shard optimizer state across data-parallel ranks (always on, as in slime).")
    for flag, dest, help_text in _FUSION_OFF:
        add(flag, dest=dest, action="store_false", default=True, help=help_text)


def _add_plugins(group) -> None:
    add = group.add_argument
    add("--custom-model-provider-path", type=str, default=None,
        help="fn(pre_process, post_process, vp_stage=None) -> GPTModel replacing the model builder.")
    add("--custom-megatron-init-path", type=str, default=None, help="fn(args) run after Megatron initialisation.")
    add("--custom-megatron-before-train-step-hook-path", type=str, default=None,
        help="fn(args, rollout_id, step_id, model, optimizer, opt_param_scheduler) before each step.")
    add("--custom-megatron-before-log-prob-hook-path", type=str, default=None,
        help="fn(args, model, store_prefix) before each log-prob pass ('' old policy, 'ref_' reference, 'teacher_' --opd-type megatron teacher).")
    add("--custom-update-weight-post-write-path", type=str, default=None,
        help="hook(args, version_dir, rollout_engines) after a disk weight write, before the engines load it.")


# ---- Model families: multi-latent attention, YaRN rotary scaling, DeepSeek-V3-style routing ----
# (flag, type, default, help). Megatron-LM's names, dests and defaults (MLATransformerConfig's
# where Megatron-LM leaves them unset); wired into megatron-core by backends/megatron_utils/config.py.
_MLA_FLAGS = (
    ("--q-lora-rank", int, None, "MLA query low-rank dim (None: queries projected directly, no q down/up)."),
    ("--kv-lora-rank", int, 512, "MLA key/value low-rank (latent) dim."),
    ("--qk-head-dim", int, 128, "MLA per-head dim of the query/key part without rotary embedding."),
    ("--qk-pos-emb-head-dim", int, 64, "MLA per-head dim of the rotary query/key part."),
    ("--v-head-dim", int, 128, "MLA per-head value dim."),
)
_ROPE_SCALING_FLAGS = (
    ("--rotary-scaling-factor", float, 1.0, "YaRN rotary scaling factor (HF rope_scaling.factor)."),
    ("--mscale", float, 1.0, "YaRN mscale (HF rope_scaling.mscale)."),
    ("--mscale-all-dim", float, 0.0, "YaRN mscale_all_dim (HF rope_scaling.mscale_all_dim)."),
    ("--original-max-position-embeddings", int, 4096,
     "YaRN original context length (HF rope_scaling.original_max_position_embeddings)."),
    ("--beta-fast", float, 32.0, "YaRN beta_fast (HF rope_scaling.beta_fast)."),
    ("--beta-slow", float, 1.0, "YaRN beta_slow (HF rope_scaling.beta_slow)."),
)
_ROUTER_FAMILY_FLAGS = (
    ("--moe-router-num-groups", int, None, "Expert groups for group-limited routing (HF n_group)."),
    ("--moe-router-group-topk", int, None, "Groups each token may route to (HF topk_group)."),
    ("--moe-router-topk-scaling-factor", float, None,
     "Scale of the routed experts' weights (HF routed_scaling_factor)."),
)


def _add_model_families(group) -> None:
    add = group.add_argument
    add("--multi-latent-attention", action="store_true", default=False,
        help="Multi-latent attention (DeepSeek-V2/V3, Kimi-K2, Moonlight); shapes from the MLA flags.")
    add("--rope-type", choices=("rope", "yarn"), default=None,
        help="Rotary type of MLA (None: yarn when --rotary-scaling-factor != 1, else rope).")
    for flag, kind, default, help_text in _MLA_FLAGS + _ROPE_SCALING_FLAGS + _ROUTER_FAMILY_FLAGS:
        add(flag, type=kind, default=default, help=help_text)


def _check_model_families(args: argparse.Namespace) -> None:
    """MLA ranks and head dims positive (and --rope-type resolved); group routing divides the experts
    and the top-k."""
    if args.multi_latent_attention:
        for flag in ("--kv-lora-rank", "--qk-head-dim", "--qk-pos-emb-head-dim", "--v-head-dim"):
            value = getattr(args, flag[2:].replace("-", "_"))
            require(value is not None and value > 0, f"{flag} must be > 0 with --multi-latent-attention, got {value}")
        if args.rope_type is None:
            args.rope_type = "yarn" if args.rotary_scaling_factor != 1.0 else "rope"
    groups, group_topk = args.moe_router_num_groups, args.moe_router_group_topk
    if groups is None and group_topk is None:
        return
    require(groups is not None and group_topk is not None,
            "--moe-router-num-groups and --moe-router-group-topk go together")
    require(bool(args.num_experts) and args.num_experts % groups == 0,
            f"--moe-router-num-groups {groups} must divide --num-experts {args.num_experts}")
    require(0 < group_topk <= groups and args.moe_router_topk % group_topk == 0,
            f"--moe-router-group-topk {group_topk} must be in 1..--moe-router-num-groups {groups} and divide "
            f"--moe-router-topk {args.moe_router_topk}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the Megatron-LM flags as one argument group."""
    group = parser.add_argument_group("megatron", "Megatron-LM model, parallel and optimizer flags.")
    _add_model(group)
    _add_moe(group)
    _add_model_families(group)
    _add_parallel(group)
    _add_optimizer(group)
    _add_plugins(group)


def _resolve_model(args: argparse.Namespace) -> None:
    """Fill Megatron-LM's derived defaults (query groups, head dim, FFN sizes, rope)."""
    if args.use_rotary_position_embeddings:
        args.position_embedding_type = "rope"
    if not args.group_query_attention and args.num_attention_heads is not None:
        args.num_query_groups = args.num_attention_heads
    if args.hidden_size is not None and args.num_attention_heads:
        if args.kv_channels is None:
            require(args.hidden_size % args.num_attention_heads == 0,
                    f"--hidden-size {args.hidden_size} is not divisible by --num-attention-heads "
                    f"{args.num_attention_heads}; give --kv-channels")
            args.kv_channels = args.hidden_size // args.num_attention_heads
        if args.ffn_hidden_size is None:
            args.ffn_hidden_size = int(4 * args.hidden_size * 2 / 3 / 64) * 64 if args.swiglu else 4 * args.hidden_size
    if args.num_experts and args.moe_ffn_hidden_size is None:
        args.moe_ffn_hidden_size = args.ffn_hidden_size
    if args.expert_tensor_parallel_size is None:
        args.expert_tensor_parallel_size = args.tensor_model_parallel_size
    require(not (args.bf16 and args.fp16), "--bf16 and --fp16 exclude each other")
    require(args.lr_warmup_fraction is None or args.lr_warmup_iters == 0,
            "--lr-warmup-fraction and --lr-warmup-iters exclude each other")
    if args.recompute_method is not None:
        require(args.recompute_granularity == "full",
                f"--recompute-method {args.recompute_method} needs --recompute-granularity full")


def _check_layout(args: argparse.Namespace) -> None:
    tp, pp, cp = args.tensor_model_parallel_size, args.pipeline_model_parallel_size, args.context_parallel_size
    ep, etp = args.expert_model_parallel_size, args.expert_tensor_parallel_size
    for flag, value in (("--tensor-model-parallel-size", tp), ("--pipeline-model-parallel-size", pp),
                        ("--context-parallel-size", cp), ("--expert-model-parallel-size", ep),
                        ("--expert-tensor-parallel-size", etp)):
        require(value >= 1, f"{flag} must be >= 1, got {value}")
    require(cp == 1 or args.transformer_impl == "transformer_engine",
            f"--context-parallel-size {cp} needs --transformer-impl transformer_engine (context-parallel "
            f"attention is Transformer Engine's); --transformer-impl {args.transformer_impl} runs CP 1 only")
    world = world_size(args)
    require(world % (tp * pp * cp) == 0,
            f"world size {world} (--actor-num-nodes {args.actor_num_nodes} x --actor-num-gpus-per-node "
            f"{args.actor_num_gpus_per_node}) is not divisible by --tensor-model-parallel-size {tp} x "
            f"--pipeline-model-parallel-size {pp} x --context-parallel-size {cp}")
    require((world // pp) % (ep * etp) == 0,
            f"--expert-model-parallel-size {ep} x --expert-tensor-parallel-size {etp} does not divide world size "
            f"{world} / --pipeline-model-parallel-size {pp} (expert data parallelism)")
    if args.num_experts is not None:
        require(args.num_experts % ep == 0,
                f"--num-experts {args.num_experts} is not divisible by --expert-model-parallel-size {ep}")
    if args.num_attention_heads is not None:
        require(args.num_attention_heads % tp == 0,
                f"--num-attention-heads {args.num_attention_heads} is not divisible by "
                f"--tensor-model-parallel-size {tp}")
        require(args.num_query_groups % tp == 0,
                f"--num-query-groups {args.num_query_groups} is not divisible by --tensor-model-parallel-size {tp}")


def _check_layers(args: argparse.Namespace) -> None:
    freq = args.moe_layer_freq
    if isinstance(freq, list) and args.num_layers is not None:
        require(len(freq) == args.num_layers,
                f"--moe-layer-freq has {len(freq)} entries but --num-layers {args.num_layers} needs one per layer")
    uneven = args.decoder_first_pipeline_num_layers or args.decoder_last_pipeline_num_layers
    if args.num_layers is not None and not uneven:
        require(args.num_layers % args.pipeline_model_parallel_size == 0,
                f"--num-layers {args.num_layers} is not divisible by --pipeline-model-parallel-size "
                f"{args.pipeline_model_parallel_size} (or give --decoder-first/last-pipeline-num-layers)")


def validate(args: argparse.Namespace) -> list[str]:
    """Fills Megatron-LM's derived values (query groups = heads without --group-query-attention,
    --kv-channels = hidden / heads, --ffn-hidden-size, --moe-ffn-hidden-size,
    --expert-tensor-parallel-size = TP). The world size (--actor-num-nodes x
    --actor-num-gpus-per-node) must be divisible by TP x PP x CP, and EP x ETP must divide
    world / PP; CP > 1 needs --transformer-impl transformer_engine; --num-experts divisible by EP; heads and query groups divisible by TP; a list
    --moe-layer-freq has --num-layers entries; --num-layers divisible by PP unless uneven stages
    are given; --sequence-parallel with TP 1 is disabled with a warning; TP > 1 with MoE needs
    --sequence-parallel; --bf16/--fp16 and the two warm-up flags exclude each other;
    --recompute-method needs --recompute-granularity full; with --multi-latent-attention the MLA head
    dims are positive and --rope-type defaults to yarn when --rotary-scaling-factor != 1;
    --moe-router-num-groups and --moe-router-group-topk go together, the groups divide the experts and
    the group top-k divides --moe-router-topk."""
    warnings: list[str] = []
    _resolve_model(args)
    _check_layout(args)
    _check_layers(args)
    _check_model_families(args)
    tp = args.tensor_model_parallel_size
    if args.sequence_parallel and tp == 1:
        args.sequence_parallel = False
        warnings.append("--sequence-parallel needs --tensor-model-parallel-size > 1: disabled")
    if tp > 1 and args.num_experts and not args.sequence_parallel:
        raise ArgumentError(f"--tensor-model-parallel-size {tp} with --num-experts {args.num_experts} requires "
                            "--sequence-parallel")
    return warnings
