"""Model shape and parameter counts for the ``--dry-run`` plan.

Owns :class:`ModelShape` (the Megatron model flags the memory model needs, with Megatron's
defaults resolved) and the parameter count of a GPT/MoE decoder split into the parts that shard
differently: tensor-parallel linears, parameters replicated across TP (norms, router) and experts.
Pure arithmetic: no torch, no megatron.
"""

from __future__ import annotations

from argparse import Namespace
from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class MLAShape:
    """Multi-latent attention dims (``--q-lora-rank`` None: queries projected directly)."""

    q_lora_rank: Optional[int]
    kv_lora_rank: int
    qk_head_dim: int
    qk_pos_emb_head_dim: int
    v_head_dim: int


@dataclass(frozen=True)
class ModelShape:
    """The decoder's shape. ``moe_layers[i]`` is True when layer ``i`` has an MoE MLP. With
    ``mla`` (multi-latent attention) ``num_kv_groups`` is the head count and ``head_dim`` the
    query/key head dim (MLA expands keys and values per head)."""

    num_layers: int
    hidden: int
    ffn_hidden: int
    num_heads: int
    num_kv_groups: int
    head_dim: int
    vocab: int
    untied: bool
    swiglu: bool
    norm_weights: int  # parameters per normalised feature: 1 for RMSNorm, 2 for LayerNorm
    qk_norm: bool
    linear_bias: bool
    qkv_bias: bool
    num_experts: int
    moe_ffn_hidden: int
    topk: int
    moe_layers: tuple[bool, ...]
    shared_expert_ffn: int
    shared_expert_gate: bool
    output_gate: bool = False  # --attention-output-gate: linear_qkv also yields a gate per query channel
    mla: Optional[MLAShape] = None


@dataclass(frozen=True)
class ParamSplit:
    """Parameter counts of one model part by how they shard.

    ``tp``: split over tensor parallel (embedding, output, attention and dense-MLP linears);
    ``replicated``: the same on every TP rank (norms, router, shared-expert gate);
    ``expert``: routed experts, split over EP * ETP.
    """

    tp: int = 0
    replicated: int = 0
    expert: int = 0

    def __add__(self, other: "ParamSplit") -> "ParamSplit":
        return ParamSplit(self.tp + other.tp, self.replicated + other.replicated, self.expert + other.expert)

    def scaled(self, n: int) -> "ParamSplit":
        """This split repeated ``n`` times."""
        return ParamSplit(self.tp * n, self.replicated * n, self.expert * n)

    @property
    def total(self) -> int:
        """All parameters of the split."""
        return self.tp + self.replicated + self.expert


def _moe_layer_pattern(freq, num_layers: int, num_experts: int) -> tuple[bool, ...]:
    """Megatron's reading of ``--moe-layer-freq``: an int N marks layers ``i % N == 0``."""
    if not num_experts:
        return (False,) * num_layers
    if freq is None:
        freq = 1
    if isinstance(freq, int):
        return tuple(i % freq == 0 for i in range(num_layers))
    pattern = tuple(bool(x) for x in freq)
    if len(pattern) != num_layers:
        raise ValueError(f"--moe-layer-freq has {len(pattern)} entries but --num-layers is {num_layers}")
    return pattern


def _default_ffn(hidden: int, swiglu: bool) -> int:
    """Megatron's default --ffn-hidden-size: 4h, or 8h/3 rounded down to a multiple of 64 with swiglu."""
    return int((4 * hidden * 2 / 3) / 64) * 64 if swiglu else 4 * hidden


def shape_from_args(args: Namespace) -> ModelShape:
    """Read the model flags (Megatron dest names) into a :class:`ModelShape`.

    Raises ValueError naming the flag when a required one is missing.
    """
    for name in ("num_layers", "hidden_size", "num_attention_heads", "vocab_size"):
        if getattr(args, name, None) is None:
            raise ValueError(f"--dry-run plan needs --{name.replace('_', '-')} (set it in MODEL_ARGS)")
    hidden, heads = args.hidden_size, args.num_attention_heads
    swiglu = bool(getattr(args, "swiglu", False))
    num_experts = getattr(args, "num_experts", None) or 0
    mla = _mla_from_args(args)
    return ModelShape(
        num_layers=args.num_layers,
        hidden=hidden,
        ffn_hidden=getattr(args, "ffn_hidden_size", None) or _default_ffn(hidden, swiglu),
        num_heads=heads,
        num_kv_groups=heads if mla else getattr(args, "num_query_groups", None) or heads,
        head_dim=mla.qk_head_dim + mla.qk_pos_emb_head_dim if mla else getattr(args, "kv_channels", None) or hidden // heads,
        vocab=args.vocab_size,
        untied=bool(getattr(args, "untie_embeddings_and_output_weights", False)),
        swiglu=swiglu,
        norm_weights=1 if getattr(args, "normalization", "LayerNorm") == "RMSNorm" else 2,
        qk_norm=bool(getattr(args, "qk_layernorm", False)),
        linear_bias=bool(getattr(args, "add_bias_linear", True)),
        qkv_bias=bool(getattr(args, "add_qkv_bias", False)),
        num_experts=num_experts,
        moe_ffn_hidden=getattr(args, "moe_ffn_hidden_size", None) or 0,
        topk=getattr(args, "moe_router_topk", None) or 0,
        moe_layers=_moe_layer_pattern(getattr(args, "moe_layer_freq", 1), args.num_layers, num_experts),
        shared_expert_ffn=getattr(args, "moe_shared_expert_intermediate_size", None) or 0,
        shared_expert_gate=bool(getattr(args, "moe_shared_expert_gate", False)),
        output_gate=bool(getattr(args, "attention_output_gate", False)),
        mla=mla,
    )


def _mla_from_args(args: Namespace) -> Optional[MLAShape]:
    """The MLA dims of ``--multi-latent-attention`` (Megatron-LM's defaults for unset ones), else None."""
    if not getattr(args, "multi_latent_attention", False):
        return None
    get = lambda name, default: getattr(args, name, None) or default  # noqa: E731
    return MLAShape(getattr(args, "q_lora_rank", None), get("kv_lora_rank", 512), get("qk_head_dim", 128),
                    get("qk_pos_emb_head_dim", 64), get("v_head_dim", 128))


def _mlp_params(s: ModelShape, ffn: int) -> int:
    """One MLP (fc1 + fc2, with swiglu fc1 has 2*ffn outputs), biases included when enabled."""
    fc1_out = ffn * (2 if s.swiglu else 1)
    bias = fc1_out + s.hidden if s.linear_bias else 0
    return s.hidden * fc1_out + ffn * s.hidden + bias


def mla_params(s: ModelShape) -> ParamSplit:
    """One multi-latent attention block: q down (h x q_lora) + q norm + q up (q_lora x a*(qk+rope)),
    or q (h x a*(qk+rope)); kv down (h x (kv_lora+rope)) + kv norm + kv up (kv_lora x a*(qk+v));
    o (a*v x h); input norm. The down projections count as replicated (both layer specs hold them
    whole on every TP rank)."""
    m, a, h = s.mla, s.num_heads, s.hidden
    q_out = a * (m.qk_head_dim + m.qk_pos_emb_head_dim)
    down = h * (m.kv_lora_rank + m.qk_pos_emb_head_dim)
    norms = (h + m.kv_lora_rank) * s.norm_weights
    if m.q_lora_rank:
        down += h * m.q_lora_rank
        norms += m.q_lora_rank * s.norm_weights
        linear = m.q_lora_rank * q_out
    else:
        linear = h * q_out
    linear += m.kv_lora_rank * a * (m.qk_head_dim + m.v_head_dim) + a * m.v_head_dim * h
    return ParamSplit(tp=linear, replicated=norms + down)


def attention_params(s: ModelShape) -> ParamSplit:
    """One self-attention block with GQA: q (h x a*d), k and v (h x g*d each), o (a*d x h),
    with --attention-output-gate a gate (h x a*d), its input norm and the optional q/k norms (d each);
    multi-latent attention: ``mla_params``."""
    if s.mla is not None:
        return mla_params(s)
    q_dim, kv_dim = s.num_heads * s.head_dim, s.num_kv_groups * s.head_dim
    gate = q_dim if s.output_gate else 0  # --attention-output-gate: one more q-sized block of linear_qkv
    linear = s.hidden * (q_dim + gate) + 2 * s.hidden * kv_dim + q_dim * s.hidden
    if s.linear_bias or s.qkv_bias:
        linear += q_dim + gate + 2 * kv_dim
    if s.linear_bias:
        linear += s.hidden
    norms = s.hidden * s.norm_weights + (2 * s.head_dim * s.norm_weights if s.qk_norm else 0)
    return ParamSplit(tp=linear, replicated=norms)


def mlp_params(s: ModelShape, moe: bool) -> ParamSplit:
    """One MLP block with its pre-MLP norm: dense swiglu/gelu MLP, or router + routed experts +
    shared experts (+ shared-expert gate) for an MoE layer."""
    norm = s.hidden * s.norm_weights
    if not moe:
        return ParamSplit(tp=_mlp_params(s, s.ffn_hidden), replicated=norm)
    shared = _mlp_params(s, s.shared_expert_ffn) if s.shared_expert_ffn else 0
    gate = s.hidden if s.shared_expert_gate else 0
    router = s.num_experts * s.hidden
    experts = s.num_experts * _mlp_params(s, s.moe_ffn_hidden)
    return ParamSplit(tp=shared, replicated=norm + router + gate, expert=experts)


def layer_params(s: ModelShape, index: int) -> ParamSplit:
    """Parameters of decoder layer ``index``."""
    return attention_params(s) + mlp_params(s, s.moe_layers[index])


def embedding_params(s: ModelShape) -> ParamSplit:
    """Word embedding (vocab x h), vocab-parallel over TP."""
    return ParamSplit(tp=s.vocab * s.hidden)


def output_params(s: ModelShape) -> ParamSplit:
    """Final norm plus the output layer when untied (vocab x h, vocab-parallel)."""
    return ParamSplit(tp=s.vocab * s.hidden if s.untied else 0, replicated=s.hidden * s.norm_weights)


def total_params(s: ModelShape) -> ParamSplit:
    """Every parameter of the model once (a tied output layer is not counted twice)."""
    layers = ParamSplit()
    for i in range(s.num_layers):
        layers = layers + layer_params(s, i)
    return embedding_params(s) + layers + output_params(s)


def active_params(s: ModelShape) -> int:
    """Parameters one token touches: everything except the routed experts it is not sent to."""
    total = total_params(s)
    if not s.num_experts:
        return total.total
    per_expert = _mlp_params(s, s.moe_ffn_hidden)
    n_moe = sum(s.moe_layers)
    return total.total - n_moe * (s.num_experts - s.topk) * per_expert
