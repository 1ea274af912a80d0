"""Rollout-engine memory for the ``--dry-run`` plan: per engine GPU, the static pool SGLang
reserves (``--sglang-mem-fraction-static`` of the GPU), the weights in it, and the KV-cache room
and token capacity left.

Sharding on an engine with tp GPUs (per pipeline stage): input embedding and attention over the
attention-tp = tp / dp (DP attention keeps them whole per DP rank); output layer over tp;
dense and shared-expert MLPs over tp; routed experts over EP x (tp / EP) = tp; norms and router
replicated. KV heads are split over attention-tp and replicated when attention-tp exceeds them.
"""

from __future__ import annotations

from argparse import Namespace
from dataclasses import dataclass

from slime.utils.plan.memory import GIB
from slime.utils.plan.model import ModelShape, attention_params, embedding_params, mlp_params, output_params
from slime.utils.plan.placement import Engine

DEFAULT_MEM_FRACTION = 0.8  # assumed when --sglang-mem-fraction-static is unset (SGLang picks its own)


@dataclass
class EngineMemory:
    """Bytes per engine GPU; ``kv_tokens_per_engine`` counts every DP-attention rank's pool."""

    mem_fraction: float
    reserved: int
    weight_dtype: str
    weights: int
    kv_bytes_per_token: int
    attention_tp: int

    @property
    def kv_room(self) -> int:
        """Pool bytes left for the KV cache after the weights."""
        return self.reserved - self.weights

    @property
    def kv_tokens_per_gpu(self) -> int:
        """Tokens whose K and V fit in the KV room of one GPU."""
        return max(0, self.kv_room) // self.kv_bytes_per_token

    @property
    def fits(self) -> bool:
        """True when the weights leave room for a KV cache."""
        return self.kv_room > 0


def is_fp8(args: Namespace) -> bool:
    """FP8 weights when --sglang-quantization is fp8 or the --hf-checkpoint path names FP8."""
    quant = str(getattr(args, "sglang_quantization", None) or "").lower()
    ckpt = str(getattr(args, "hf_checkpoint", None) or "").lower()
    return "fp8" in quant or "fp8" in ckpt


def _engine_weight_bytes(s: ModelShape, engine: Engine, attn_tp: int, linear_bytes: int) -> float:
    """Weights on one engine GPU; linears at ``linear_bytes``, embeddings/norms/router at 2."""
    attn = attention_params(s)
    # SGLang shards the input embedding over the attention-tp group (whole per rank with DP
    # attention) and the output layer over the full tp.
    total = 2 * embedding_params(s).tp / attn_tp + 2 * output_params(s).tp / engine.tp
    total += 2 * output_params(s).replicated
    for moe in s.moe_layers:
        mlp = mlp_params(s, moe)
        total += linear_bytes * attn.tp / attn_tp + 2 * (attn.replicated + mlp.replicated)
        total += linear_bytes * (mlp.tp + mlp.expert) / engine.tp
    pp = max(1, len(engine.gpus) // engine.tp)
    return total / pp


def engine_memory(args: Namespace, s: ModelShape, engine: Engine) -> EngineMemory:
    """Static memory of one GPU of ``engine`` against --gpu-memory-gib."""
    fraction = getattr(args, "sglang_mem_fraction_static", None) or DEFAULT_MEM_FRACTION
    reserved = int(fraction * args.gpu_memory_gib * GIB)
    fp8 = is_fp8(args)
    attn_tp = max(1, engine.tp // max(1, engine.dp))
    weights = int(_engine_weight_bytes(s, engine, attn_tp, 1 if fp8 else 2))
    kv_dtype = str(getattr(args, "sglang_kv_cache_dtype", None) or "auto").lower()
    kv_elem = 1 if "fp8" in kv_dtype else 2
    kv_heads = max(1.0, s.num_kv_groups / attn_tp)
    pp = max(1, len(engine.gpus) // engine.tp)
    per_token = int(2 * (s.num_layers / pp) * kv_heads * s.head_dim * kv_elem)
    if s.mla is not None:  # SGLang caches MLA's latent and rotary key, one head, every rank the same
        per_token = int((s.num_layers / pp) * (s.mla.kv_lora_rank + s.mla.qk_pos_emb_head_dim) * kv_elem)
    return EngineMemory(fraction, reserved, "fp8" if fp8 else "bf16", weights, per_token, attn_tp)
