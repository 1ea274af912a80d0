"""Shared pieces of the tiny checkpoints' parameter shapes (``tools/make_tiny_model.py``).

Owns the shapes of the standard GQA attention of a layer; a family whose attention differs
declares its own ``tiny_attention_shapes`` in its module (e.g. multi-latent attention).
"""

from __future__ import annotations


def gqa_shapes(config: dict, prefix: str, qk_norm_default: bool = False) -> dict[str, tuple[int, ...]]:
    """GQA attention: q, k, v (+ biases with attention_bias), o, q/k norms (with ``use_qk_norm``,
    ``qk_norm_default`` when the config does not say)."""
    hidden, head_dim = config["hidden_size"], config["head_dim"]
    q_out = config["num_attention_heads"] * head_dim
    kv_out = config["num_key_value_heads"] * head_dim
    shapes = {}
    for name, out in (("q_proj", q_out), ("k_proj", kv_out), ("v_proj", kv_out)):
        shapes[prefix + name + ".weight"] = (out, hidden)
        if config.get("attention_bias"):
            shapes[prefix + name + ".bias"] = (out,)
    shapes[prefix + "o_proj.weight"] = (hidden, q_out)
    if config.get("use_qk_norm", qk_norm_default):
        shapes.update({prefix + "q_norm.weight": (head_dim,), prefix + "k_norm.weight": (head_dim,)})
    return shapes
