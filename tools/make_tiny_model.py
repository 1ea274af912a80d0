"""Tiny checkpoints of the supported model families for tests and CPU runs, built locally with no
download.

Owns the toy-size Qwen3-MoE (`Qwen3MoeForCausalLM`, the Qwen3-30B-A3B structure), dense Qwen3
(`Qwen3ForCausalLM`), DeepSeek-V3 (`DeepseekV3ForCausalLM`: multi-latent attention with a q
low-rank path and YaRN rotary scaling, one dense first layer, sigmoid routing over expert groups
with an expert bias, a shared expert; the structure of DeepSeek-V3/R1, Kimi-K2 and Moonlight) and
GLM-4.5 MoE (`Glm4MoeForCausalLM`: QKV biases, QK norms, partial rotary, one dense first layer,
sigmoid routing with expert bias, a shared expert) configurations, a character-level tokenizer
with Qwen's special tokens and chat template (the same for every variant), and deterministic
weight initialisation: the same seed gives the same bytes.

The checkpoint folder holds config.json, model.safetensors (Hugging Face parameter names, one
tensor per expert as in the released Qwen3-MoE checkpoints), tokenizer.json,
tokenizer_config.json, special_tokens_map.json and generation_config.json.

With `fp8_block_size` (CLI `--fp8`), the checkpoint is block-FP8 like Qwen3-*-FP8: the same
weights, every attention / MLP / expert projection stored as float8_e4m3fn plus a float32
`weight_scale_inv` (slime.utils.fp8), norms, router, embeddings and lm_head kept in float32, and
config.json gains `quantization_config` {"quant_method": "fp8", "fmt": "e4m3",
"activation_scheme": "dynamic", "weight_block_size": [32, 32]}. [32, 32] rather than the released
[128, 128] because the tiny projections are 32-64 wide: every one of them gets whole blocks.

Usage: python tools/make_tiny_model.py --output-dir DIR [--variant moe|dense|deepseek_v3|glm4_moe]
       [--seed 0] [--fp8] [--config KEY=JSON ...]
"""

import argparse
import json
import logging
from pathlib import Path

logger = logging.getLogger(__name__)

# Characters the tokenizer knows, one token each: digits first so they have small stable ids.
CHARACTERS = (
    "0123456789"
    "abcdefghijklmnopqrstuvwxyz"
    "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    " \n\t"
    "+-*/=?.,:;!()[]{}<>'\"_\\|#$%^&~`@"
)
UNK_TOKEN = "<unk>"
# Qwen's special tokens, in Qwen's order: <|endoftext|> pads, <|im_end|> ends a turn (eos).
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# Qwen3 registers the thinking tags as added tokens that are not "special" (they stay in text).
THINK_TOKENS = ("<think>", "</think>")
PAD_TOKEN, BOS_TOKEN, EOS_TOKEN = "<|endoftext|>", "<|endoftext|>", "<|im_end|>"
# Embedding rows; the tokenizer uses fewer ids, like Qwen (151936 rows, ~151665 tokens).
# 128 divides by Megatron's default vocab padding unit, so no padding is ever needed.
VOCAB_SIZE = 128

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
)

# Model shapes per variant; values are the Hugging Face config names.
_COMMON_CONFIG = {
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "hidden_act": "silu",
    "max_position_embeddings": 512,
    "initializer_range": 0.02,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "rope_scaling": None,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "tie_word_embeddings": False,
    "use_cache": True,
    "use_sliding_window": False,
    "sliding_window": None,
    "max_window_layers": 2,
    "torch_dtype": "float32",
}
_VARIANT_CONFIG = {
    "moe": {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "norm_topk_prob": True,
        "output_router_logits": False,
        "router_aux_loss_coef": 0.001,
    },
    "dense": {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
    },
    # DeepSeek-V3 keys as released (rope_scaling, n_routed_experts, ...); head_dim is the rotary dim
    # as transformers sets it. qk 16+8 and v 16 head dims differ, as in the real model (192 / 128).
    "deepseek_v3": {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "num_key_value_heads": 4,
        "head_dim": 8,
        "q_lora_rank": 32,
        "kv_lora_rank": 32,
        "qk_nope_head_dim": 16,
        "qk_rope_head_dim": 8,
        "v_head_dim": 16,
        "rope_theta": 10000.0,
        "rope_scaling": {"type": "yarn", "rope_type": "yarn", "factor": 4.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                         "original_max_position_embeddings": 128, "beta_fast": 32, "beta_slow": 1},
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "n_shared_experts": 1,
        "first_k_dense_replace": 1,
        "moe_layer_freq": 1,
        "n_group": 4,
        "topk_group": 1,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "norm_topk_prob": True,
        "routed_scaling_factor": 2.5,
        "aux_loss_alpha": 0.001,
        "ep_size": 1,
        "num_nextn_predict_layers": 0,
    },
    # GLM-4.5 keys as released; partial rotary: half of each 16-dim head.
    "glm4_moe": {
        "architectures": ["Glm4MoeForCausalLM"],
        "model_type": "glm4_moe",
        "attention_bias": True,
        "use_qk_norm": True,
        "partial_rotary_factor": 0.5,
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "n_shared_experts": 1,
        "first_k_dense_replace": 1,
        "n_group": 1,
        "topk_group": 1,
        "norm_topk_prob": True,
        "routed_scaling_factor": 2.5,
        "num_nextn_predict_layers": 0,
    },
}
# Qwen3-only keys the other families do not declare.
_QWEN_ONLY_KEYS = ("use_sliding_window", "sliding_window", "max_window_layers")


def token_ids() -> dict[str, int]:
    """Return the tokenizer's token -> id map: characters, then <unk>, then special tokens."""
    tokens = list(CHARACTERS) + [UNK_TOKEN] + list(SPECIAL_TOKENS) + list(THINK_TOKENS)
    if len(set(tokens)) != len(tokens) or len(tokens) > VOCAB_SIZE:
        raise ValueError(f"tiny tokenizer: {len(tokens)} tokens, duplicates or more than {VOCAB_SIZE}")
    return {tok: i for i, tok in enumerate(tokens)}


def model_config(variant: str, overrides: dict | None = None) -> dict:
    """Return the config.json dict of a tiny variant (a `_VARIANT_CONFIG` key), keys sorted.

    `overrides` replaces shape keys the variant already has (e.g. {"num_key_value_heads": 4,
    "num_hidden_layers": 4} so a recipe's TP / PP sizes divide them, see tools/recipe_twin.py);
    an unknown key is an error, so a typo never writes a config the converters ignore.
    """
    if variant not in _VARIANT_CONFIG:
        raise ValueError(f"--variant {variant!r}: expected one of {sorted(_VARIANT_CONFIG)}")
    ids = token_ids()
    config = {**_COMMON_CONFIG, **_VARIANT_CONFIG[variant]}
    unknown = sorted(set(overrides or {}) - set(config))
    if unknown:
        raise ValueError(f"--config {unknown}: not keys of the {variant} config ({sorted(config)})")
    config.update(overrides or {})
    if not config["model_type"].startswith("qwen3"):
        config = {k: v for k, v in config.items() if k not in _QWEN_ONLY_KEYS}
    config.update(bos_token_id=ids[BOS_TOKEN], eos_token_id=ids[EOS_TOKEN], pad_token_id=ids[PAD_TOKEN])
    return dict(sorted(config.items()))


def parameter_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """Return {Hugging Face parameter name: shape} for a tiny config, in a fixed order."""
    hidden, vocab = config["hidden_size"], config["vocab_size"]
    attention = _ATTENTION_SHAPES[config["model_type"]]
    shapes = {"model.embed_tokens.weight": (vocab, hidden)}
    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        shapes.update({p + "input_layernorm.weight": (hidden,), p + "post_attention_layernorm.weight": (hidden,)})
        shapes.update(attention(config, p + "self_attn."))
        shapes.update(_mlp_shapes(config, p + "mlp.", layer))
    shapes["model.norm.weight"] = (hidden,)
    shapes["lm_head.weight"] = (vocab, hidden)
    return shapes


def _gqa_shapes(config: dict, prefix: str) -> dict[str, tuple[int, ...]]:
    """Qwen3 / GLM-4.5 attention: q, k, v (+ biases with attention_bias), o, q/k norms."""
    hidden, head_dim = config["hidden_size"], config["head_dim"]
    q_out = config["num_attention_heads"] * head_dim
    kv_out = config["num_key_value_heads"] * head_dim
    shapes = {}
    for name, out in (("q_proj", q_out), ("k_proj", kv_out), ("v_proj", kv_out)):
        shapes[prefix + name + ".weight"] = (out, hidden)
        if config.get("attention_bias"):
            shapes[prefix + name + ".bias"] = (out,)
    shapes[prefix + "o_proj.weight"] = (hidden, q_out)
    if config.get("use_qk_norm", config["model_type"].startswith("qwen3")):
        shapes.update({prefix + "q_norm.weight": (head_dim,), prefix + "k_norm.weight": (head_dim,)})
    return shapes


def _mla_shapes(config: dict, prefix: str) -> dict[str, tuple[int, ...]]:
    """DeepSeek-V3 multi-latent attention: q low-rank path, kv latent + shared rotary key, o."""
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    qk_dim = config["qk_nope_head_dim"] + config["qk_rope_head_dim"]
    kv_rank = config["kv_lora_rank"]
    return {
        prefix + "q_a_proj.weight": (config["q_lora_rank"], hidden),
        prefix + "q_a_layernorm.weight": (config["q_lora_rank"],),
        prefix + "q_b_proj.weight": (heads * qk_dim, config["q_lora_rank"]),
        prefix + "kv_a_proj_with_mqa.weight": (kv_rank + config["qk_rope_head_dim"], hidden),
        prefix + "kv_a_layernorm.weight": (kv_rank,),
        prefix + "kv_b_proj.weight": (heads * (config["qk_nope_head_dim"] + config["v_head_dim"]), kv_rank),
        prefix + "o_proj.weight": (hidden, heads * config["v_head_dim"]),
    }


_ATTENTION_SHAPES = {"qwen3": _gqa_shapes, "qwen3_moe": _gqa_shapes, "glm4_moe": _gqa_shapes,
                     "deepseek_v3": _mla_shapes}


def _swiglu_shapes(prefix: str, hidden: int, inter: int) -> dict[str, tuple[int, ...]]:
    return {
        prefix + "gate_proj.weight": (inter, hidden),
        prefix + "up_proj.weight": (inter, hidden),
        prefix + "down_proj.weight": (hidden, inter),
    }


def _mlp_shapes(config: dict, prefix: str, layer: int) -> dict[str, tuple[int, ...]]:
    """Shapes of one layer's MLP: a router (+ its expert bias) plus one SwiGLU per expert and the
    shared experts (MoE), or one SwiGLU (dense models, and the first_k_dense_replace layers)."""
    hidden = config["hidden_size"]
    experts = config.get("num_experts") or config.get("n_routed_experts")
    if not experts or layer < config.get("first_k_dense_replace", 0):
        return _swiglu_shapes(prefix, hidden, config["intermediate_size"])
    inter = config["moe_intermediate_size"]
    shapes = {prefix + "gate.weight": (experts, hidden)}
    if "n_routed_experts" in config:
        shapes[prefix + "gate.e_score_correction_bias"] = (experts,)
    for e in range(experts):
        shapes.update(_swiglu_shapes(f"{prefix}experts.{e}.", hidden, inter))
    if config.get("n_shared_experts"):
        shapes.update(_swiglu_shapes(prefix + "shared_experts.", hidden, inter * config["n_shared_experts"]))
    return shapes


def init_weights(config: dict, seed: int) -> dict:
    """Return {name: float32 tensor}: norms are ones, every matrix and bias ~ N(0, initializer_range).

    One torch.Generator seeded with `seed` draws the matrices and biases in `parameter_shapes`
    order, so the result depends only on (config, seed). Small weights keep a random model's
    next-token distribution close to uniform; random router expert biases make them matter.
    """
    import torch

    gen = torch.Generator().manual_seed(seed)
    std = config["initializer_range"]
    tensors = {}
    for name, shape in parameter_shapes(config).items():
        if len(shape) == 1 and not name.endswith(("bias", "e_score_correction_bias")):
            tensors[name] = torch.ones(shape, dtype=torch.float32)
        else:
            tensors[name] = torch.empty(shape, dtype=torch.float32).normal_(0.0, std, generator=gen)
    return tensors


def build_tokenizer():
    """Return a `tokenizers.Tokenizer`: one token per character, Qwen special tokens added."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    ids = token_ids()
    base = {tok: i for tok, i in ids.items() if tok not in SPECIAL_TOKENS + THINK_TOKENS}
    tokenizer = Tokenizer(models.WordLevel(vocab=base, unk_token=UNK_TOKEN))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    # Added in id order so each keeps the id token_ids() gave it.
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in THINK_TOKENS])
    for tok, i in ids.items():
        if tokenizer.token_to_id(tok) != i:
            raise RuntimeError(f"tiny tokenizer: {tok!r} got id {tokenizer.token_to_id(tok)}, expected {i}")
    return tokenizer


def tokenizer_files(config: dict) -> dict[str, dict]:
    """Return the JSON side files: tokenizer_config, special_tokens_map, generation_config."""
    special = {"eos_token": EOS_TOKEN, "pad_token": PAD_TOKEN, "unk_token": UNK_TOKEN}
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": CHAT_TEMPLATE,
        "additional_special_tokens": list(SPECIAL_TOKENS[1:]),
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "model_max_length": config["max_position_embeddings"],
        "split_special_tokens": False,
        **special,
    }
    generation_config = {
        "bos_token_id": config["bos_token_id"],
        "eos_token_id": [config["eos_token_id"], config["pad_token_id"]],
        "pad_token_id": config["pad_token_id"],
        "do_sample": True,
        "temperature": 1.0,
        "top_k": 0,
        "top_p": 1.0,
    }
    return {
        "tokenizer_config.json": tokenizer_config,
        "special_tokens_map.json": {**special, "additional_special_tokens": list(SPECIAL_TOKENS[1:])},
        "generation_config.json": generation_config,
    }


FP8_BLOCK_SIZE = (32, 32)


def make_tiny_model(output_dir, variant: str = "moe", seed: int = 0, fp8_block_size=None,
                    overrides: dict | None = None) -> Path:
    """Write a tiny checkpoint folder to `output_dir` and return its Path.

    `variant` is "moe" (Qwen3MoeForCausalLM), "dense" (Qwen3ForCausalLM), "deepseek_v3"
    (DeepseekV3ForCausalLM) or "glm4_moe" (Glm4MoeForCausalLM); `fp8_block_size`
    (bn, bk) makes it block-FP8 (module docstring); `overrides` changes config keys (`model_config`). The files are a pure function of the
    arguments: two calls give byte-identical folders.
    """
    from safetensors.torch import save_file

    out = Path(output_dir)
    config = model_config(variant, overrides)
    tensors = init_weights(config, seed)
    if fp8_block_size is not None:
        from slime.utils.fp8 import fp8_config_from_hf, quantize_named

        config["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                         "weight_block_size": [int(b) for b in fp8_block_size]}
        tensors = dict(quantize_named(tensors.items(), fp8_config_from_hf(config)))
    out.mkdir(parents=True, exist_ok=True)
    _write_json(out / "config.json", config)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    build_tokenizer().save(str(out / "tokenizer.json"))
    for name, content in tokenizer_files(config).items():
        _write_json(out / name, content)
    for path in sorted(out.iterdir()):
        logger.info("wrote %s", path)
    return out


def _write_json(path: Path, content: dict) -> None:
    """Write `content` as indented JSON with a trailing newline."""
    path.write_text(json.dumps(content, indent=2) + "\n")


def _parse_args(argv=None) -> argparse.Namespace:
    """Parse the command line of this tool."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output-dir", required=True, help="folder to write the checkpoint into")
    parser.add_argument("--variant", choices=sorted(_VARIANT_CONFIG), default="moe",
                        help="moe: Qwen3MoeForCausalLM; dense: Qwen3ForCausalLM; deepseek_v3: "
                             "DeepseekV3ForCausalLM (MLA); glm4_moe: Glm4MoeForCausalLM")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weight initialisation")
    parser.add_argument("--fp8", action="store_true",
                        help="write a block-FP8 checkpoint (float8_e4m3fn + weight_scale_inv, like Qwen3-*-FP8)")
    parser.add_argument("--fp8-block-size", type=int, nargs=2, default=list(FP8_BLOCK_SIZE), metavar=("BN", "BK"),
                        help="weight_block_size of --fp8 (default 32 32)")
    parser.add_argument("--config", nargs="*", default=[], metavar="KEY=JSON",
                        help="override config.json keys of the variant, values as JSON "
                             "(e.g. num_key_value_heads=4 num_hidden_layers=4)")
    return parser.parse_args(argv)


def parse_overrides(items: list[str]) -> dict:
    """`["num_hidden_layers=4", ...]` -> {"num_hidden_layers": 4, ...} (values parsed as JSON)."""
    pairs = [item.partition("=") for item in items]
    bad = [item for item, (_, eq, _) in zip(items, pairs) if not eq]
    if bad:
        raise ValueError(f"--config {bad}: expected KEY=JSON")
    return {key: json.loads(value) for key, _, value in pairs}


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    cli = _parse_args()
    make_tiny_model(cli.output_dir, variant=cli.variant, seed=cli.seed,
                    fp8_block_size=cli.fp8_block_size if cli.fp8 else None,
                    overrides=parse_overrides(cli.config))
