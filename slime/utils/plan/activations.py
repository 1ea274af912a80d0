"""Activation memory of one trainer micro-batch for the ``--dry-run`` plan.

Per-layer bytes follow Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
Models" (2022), counted tensor by tensor so GQA, qk-norm, flash attention and MoE routing fit in.
All activations are 16-bit (2 bytes) except the router's fp32 logits and probabilities. Dropout is
taken as 0 (RL recipes set --attention-dropout 0 --hidden-dropout 0), so no dropout masks.
``docs/dry-run-plan.md`` writes every term out.
"""

from __future__ import annotations

from dataclasses import dataclass

from slime.utils.plan.layout import ParallelLayout
from slime.utils.plan.model import ModelShape

ACT_BYTES = 2  # bf16/fp16 activations
ROUTER_BYTES = 4  # --moe-router-dtype fp32 logits and probabilities


@dataclass(frozen=True)
class LayerActivations:
    """Bytes stored for backward by one decoder layer for ``tokens`` tokens on one GPU.

    ``core_attention`` is the part selective recompute drops (flash-attention output and
    log-sum-exp, or the softmax scores without flash attention).
    """

    attention: int
    core_attention: int
    mlp: int

    @property
    def total(self) -> int:
        """Bytes of the whole layer."""
        return self.attention + self.core_attention + self.mlp


def _attention(s: ModelShape, lay: ParallelLayout, tokens: int, seq_len: int, flash: bool):
    sp = lay.tp if lay.sequence_parallel else 1
    a, g, d, t = s.num_heads, s.num_kv_groups, s.head_dim, lay.tp
    per_token = 2 * ACT_BYTES * s.hidden / sp  # norm input + QKV-linear input (sharded with SP)
    per_token += ACT_BYTES * (a + 2 * g) * d / t  # q, k, v after rotary
    if s.qk_norm:
        per_token += ACT_BYTES * (a + g) * d / t  # q/k norm inputs
    if flash:
        core = ACT_BYTES * a * d / t + 4 * a / t  # output (also the out-proj input) + fp32 lse
    else:
        core = ACT_BYTES * a * d / t + ACT_BYTES * a * seq_len / t  # output + softmax scores
    return int(per_token * tokens), int(core * tokens)


def _dense_mlp(s: ModelShape, lay: ParallelLayout, tokens: int, ffn: int, with_norm: bool) -> int:
    sp = lay.tp if lay.sequence_parallel else 1
    fc1_out = ffn * (2 if s.swiglu else 1)
    per_token = (2 if with_norm else 1) * ACT_BYTES * s.hidden / sp  # norm input, fc1 input
    per_token += ACT_BYTES * (fc1_out + ffn) / lay.tp  # fc1 output, activation output (fc2 input)
    return int(per_token * tokens)


def _moe_mlp(s: ModelShape, lay: ParallelLayout, tokens: int) -> int:
    sp = lay.tp if lay.sequence_parallel else 1
    local = tokens / sp  # tokens entering the MoE block on this GPU
    per_token = 2 * ACT_BYTES * s.hidden + 2 * ROUTER_BYTES * s.num_experts  # norm in/out, router
    # Each token is sent to top-k experts; balanced routing gives every GPU local*k copies,
    # gathered over ETP whose ranks each hold ffn/ETP of the expert.
    copies = local * s.topk * lay.etp
    fc1_out = s.moe_ffn_hidden * (2 if s.swiglu else 1) / lay.etp
    per_copy = ACT_BYTES * (3 * s.hidden + fc1_out + s.moe_ffn_hidden / lay.etp)  # permuted, received, fc2 out
    shared = _dense_mlp(s, lay, tokens, s.shared_expert_ffn, with_norm=False) if s.shared_expert_ffn else 0
    return int(per_token * local + per_copy * copies) + shared


def layer_activations(s: ModelShape, lay: ParallelLayout, index: int, tokens: int, seq_len: int,
                      flash: bool = True) -> LayerActivations:
    """Activations of decoder layer ``index`` for ``tokens`` tokens per GPU (after CP split).

    ``seq_len`` (longest sample) only matters without flash attention (the a*s*s score term).
    """
    attn, core = _attention(s, lay, tokens, seq_len, flash)
    if s.moe_layers[index]:
        mlp = _moe_mlp(s, lay, tokens)
    else:
        mlp = _dense_mlp(s, lay, tokens, s.ffn_hidden, with_norm=True)
    return LayerActivations(attn, core, mlp)


def _checkpoint_bytes(s: ModelShape, lay: ParallelLayout, tokens: int) -> int:
    """One layer-group input kept by full recompute: [tokens/SP, h] 16-bit."""
    sp = lay.tp if lay.sequence_parallel else 1
    return int(ACT_BYTES * s.hidden * tokens / sp)


def stage_activations(s: ModelShape, lay: ParallelLayout, layers: range, tokens: int, seq_len: int,
                      recompute: dict, flash: bool = True) -> int:
    """Activation bytes of one micro-batch on one pipeline stage holding ``layers``.

    ``recompute``: {"granularity": None|"full"|"selective", "method": "uniform"|"block",
    "num_layers": n}. none: every layer's activations; selective: core attention dropped;
    full+uniform: one checkpointed input per group of n layers plus the working set of one
    recomputed group; full+block: the first n layers keep only their input, plus the larger
    of the stored later layers and one recomputed layer's working set. Transient gradient
    buffers of the layer in backward are not counted in any mode (fragmentation covers them).
    """
    per_layer = [layer_activations(s, lay, i, tokens, seq_len, flash) for i in layers]
    if not per_layer:
        return 0
    granularity = recompute.get("granularity")
    if granularity is None:
        return sum(a.total for a in per_layer)
    if granularity == "selective":
        return sum(a.attention + a.mlp for a in per_layer)
    n = max(1, recompute.get("num_layers") or 1)
    largest = max(a.total for a in per_layer)
    if recompute.get("method", "uniform") == "block":
        # Backward runs last layer first: by the time a checkpointed layer is recomputed, the
        # stored layers after it are freed, so the peak is the larger of the two.
        stored = sum(a.total for a in per_layer[n:])
        return min(n, len(per_layer)) * _checkpoint_bytes(s, lay, tokens) + max(stored, largest)
    groups = -(-len(per_layer) // n)
    return groups * _checkpoint_bytes(s, lay, tokens) + min(n, len(per_layer)) * largest


def logits_bytes(s: ModelShape, lay: ParallelLayout, tokens: int) -> int:
    """Output-layer logits on the last stage: tokens x vocab/TP in fp32, twice (logits and the
    log-softmax used for log-probs and entropy); plus the final norm and output-layer inputs."""
    sp = lay.tp if lay.sequence_parallel else 1
    return int(tokens * s.vocab / lay.tp * 4 * 2 + 2 * ACT_BYTES * s.hidden * tokens / sp)
