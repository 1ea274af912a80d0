"""Tiny checkpoints of the supported model families for tests and CPU runs, built locally with no
download.

Owns the shared tiny shape (2 layers, hidden 64, 4 heads of 16), a character-level tokenizer with
Qwen's special tokens and chat template (the same for every variant), and deterministic weight
initialisation: the same seed gives the same bytes. The variants are the families' own
(`TinyVariant` in `slime/models/<family>.py`, listed by `slime.models.tiny_variant_names`): moe
(`Qwen3MoeForCausalLM`, the Qwen3-30B-A3B structure), dense (`Qwen3ForCausalLM`), deepseek_v3
(`DeepseekV3ForCausalLM`: multi-latent attention with a q low-rank path and YaRN rotary scaling,
one dense first layer, sigmoid routing over expert groups with an expert bias, a shared expert; the
structure of DeepSeek-V3/R1, Kimi-K2 and Moonlight) and glm4_moe (`Glm4MoeForCausalLM`: QKV biases,
QK norms, partial rotary, one dense first layer, sigmoid routing with expert bias, a shared expert).

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
       python tools/make_tiny_model.py --variant NAME --model-script   # prints its scripts/models/ file
"""

import argparse
import copy
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

# The shape every variant starts from; values are the Hugging Face config names. Each family's
# variants add their own keys (`TinyVariant.config` in slime/models/<family>.py).
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
    "torch_dtype": "float32",
}


def token_ids() -> dict[str, int]:
    """Return the tokenizer's token -> id map: characters, then <unk>, then special tokens."""
    tokens = list(CHARACTERS) + [UNK_TOKEN] + list(SPECIAL_TOKENS) + list(THINK_TOKENS)
    if len(set(tokens)) != len(tokens) or len(tokens) > VOCAB_SIZE:
        raise ValueError(f"tiny tokenizer: {len(tokens)} tokens, duplicates or more than {VOCAB_SIZE}")
    return {tok: i for i, tok in enumerate(tokens)}


def model_config(variant: str, overrides: dict | None = None) -> dict:
    """Return the config.json dict of a tiny variant (`slime.models.tiny_variant_names`), keys sorted.

    `overrides` replaces shape keys the variant already has (e.g. {"num_key_value_heads": 4,
    "num_hidden_layers": 4} so a recipe's TP / PP sizes divide them, see tools/recipe_twin.py);
    an unknown key is an error, so a typo never writes a config the converters ignore.
    """
    from slime.models import tiny_variant

    ids = token_ids()
    config = copy.deepcopy({**_COMMON_CONFIG, **tiny_variant(variant)[1].config})
    unknown = sorted(set(overrides or {}) - set(config))
    if unknown:
        raise ValueError(f"--config {unknown}: not keys of the {variant} config ({sorted(config)})")
    config.update(overrides or {})
    config.update(bos_token_id=ids[BOS_TOKEN], eos_token_id=ids[EOS_TOKEN], pad_token_id=ids[PAD_TOKEN])
    return dict(sorted(config.items()))


def parameter_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """Return {Hugging Face parameter name: shape} for a tiny config, in a fixed order."""
    from slime.models import model_family

    hidden, vocab = config["hidden_size"], config["vocab_size"]
    attention = model_family(config).tiny_attention_shapes
    shapes = {"model.embed_tokens.weight": (vocab, hidden)}
    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        shapes.update({p + "input_layernorm.weight": (hidden,), p + "post_attention_layernorm.weight": (hidden,)})
        shapes.update(attention(config, p + "self_attn."))
        shapes.update(_mlp_shapes(config, p + "mlp.", layer))
    shapes["model.norm.weight"] = (hidden,)
    shapes["lm_head.weight"] = (vocab, hidden)
    return shapes


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

    `variant` names a family's tiny variant (`slime.models.tiny_variant_names`: "moe"
    (Qwen3MoeForCausalLM), "dense" (Qwen3ForCausalLM), "deepseek_v3" (DeepseekV3ForCausalLM),
    "glm4_moe" (Glm4MoeForCausalLM), ...); `fp8_block_size`
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
    from slime.models import tiny_variant_names

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output-dir", help="folder to write the checkpoint into (required unless --model-script)")
    parser.add_argument("--variant", choices=tiny_variant_names(), default="moe",
                        help="a family's tiny variant (slime/models/<family>.py): moe: Qwen3MoeForCausalLM; dense: "
                             "Qwen3ForCausalLM; deepseek_v3: DeepseekV3ForCausalLM (MLA); glm4_moe: Glm4MoeForCausalLM")
    parser.add_argument("--model-script", action="store_true",
                        help="print the variant's MODEL_ARGS script (a file name under scripts/models/) and exit")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weight initialisation")
    parser.add_argument("--fp8", action="store_true",
                        help="write a block-FP8 checkpoint (float8_e4m3fn + weight_scale_inv, like Qwen3-*-FP8)")
    parser.add_argument("--fp8-block-size", type=int, nargs=2, default=list(FP8_BLOCK_SIZE), metavar=("BN", "BK"),
                        help="weight_block_size of --fp8 (default 32 32)")
    parser.add_argument("--config", nargs="*", default=[], metavar="KEY=JSON",
                        help="override config.json keys of the variant, values as JSON "
                             "(e.g. num_key_value_heads=4 num_hidden_layers=4)")
    cli = parser.parse_args(argv)
    if cli.output_dir is None and not cli.model_script:
        parser.error("--output-dir is required")
    return cli


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
    if cli.model_script:
        from slime.models import tiny_variant

        print(tiny_variant(cli.variant)[1].script)
        raise SystemExit(0)
    make_tiny_model(cli.output_dir, variant=cli.variant, seed=cli.seed,
                    fp8_block_size=cli.fp8_block_size if cli.fp8 else None,
                    overrides=parse_overrides(cli.config))
