"""HF <-> Megatron weight maps: round trips are the identity for every transform and layout."""

import itertools

import pytest
import torch

from slime.models import model_family, tiny_variant_names, weight_map_for
from slime.models import transforms as tf
from slime.models.weight_map import (
    MegatronLayout,
    ShardContext,
    gather_tensor,
    global_name,
    local_name,
    shard_tensor,
)
from tests.conftest import load_tool

LAYOUTS = [MegatronLayout(te, grouped) for te, grouped in itertools.product([False, True], repeat=2)]


def _layout_id(layout):
    return f"te{int(layout.te_norms)}-grouped{int(layout.grouped_experts)}"


def _config(variant, **overrides):
    config = load_tool("make_tiny_model").model_config(variant)
    config.update(overrides)
    return config


def _random_hf(config):
    shapes = load_tool("make_tiny_model").parameter_shapes(config)
    gen = torch.Generator().manual_seed(0)
    return {name: torch.randn(shape, generator=gen) for name, shape in shapes.items()}


VARIANTS = tiny_variant_names()  # every family's tiny variants (slime.models registry)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("layout", LAYOUTS, ids=_layout_id)
def test_hf_megatron_hf_is_identity(variant, layout):
    config = _config(variant, vocab_size=200)  # 200 pads to 256: exercises vocab padding
    hf = _random_hf(config)
    wmap = weight_map_for(config)
    back = {}
    for name in wmap.megatron_names(layout):
        full = wmap.to_megatron(name, [hf[n] for n in wmap.hf_names(name)])
        if name.startswith(("embedding.", "output_layer.")):
            assert full.shape[0] == 256 and not full[200:].any()
        for hf_name, tensor in wmap.to_hf(name, full):
            assert hf_name not in back, f"{hf_name} produced twice"
            back[hf_name] = tensor
    assert back.keys() == hf.keys()
    assert all(torch.equal(back[n], hf[n]) for n in hf)


def test_te_and_grouped_names():
    wmap = weight_map_for(_config("moe"))
    names = set(wmap.megatron_names(MegatronLayout(te_norms=True, grouped_experts=True)))
    assert "decoder.layers.0.self_attention.linear_qkv.layer_norm_weight" in names
    assert "decoder.layers.1.pre_mlp_layernorm.weight" in names  # MoE: no fused norm
    assert "decoder.layers.1.mlp.experts.linear_fc1.weight7" in names
    dense = set(weight_map_for(_config("dense")).megatron_names(MegatronLayout(te_norms=True)))
    assert "decoder.layers.0.mlp.linear_fc1.layer_norm_weight" in dense
    assert wmap.hf_names("decoder.layers.1.mlp.experts.local_experts.3.linear_fc2.weight") == [
        "model.layers.1.mlp.experts.3.down_proj.weight"
    ]
    assert wmap.hf_names("decoder.layers.0.mlp.router.weight") == ["model.layers.0.mlp.gate.weight"]


def test_qkv_interleave_per_query_group():
    shape = tf.AttentionShape(num_heads=4, num_groups=2, head_dim=1)
    q = torch.tensor([[0.0], [1.0], [2.0], [3.0]])  # heads 0,1 -> group 0; 2,3 -> group 1
    k = torch.tensor([[10.0], [11.0]])
    v = torch.tensor([[20.0], [21.0]])
    qkv = tf.qkv_hf_to_megatron(q, k, v, shape)
    assert qkv.flatten().tolist() == [0, 1, 10, 20, 2, 3, 11, 21]
    # TP=2: each rank holds whole query groups.
    assert tf.split_for_tp("qkv", qkv, 1, 2).flatten().tolist() == [2, 3, 11, 21]


def test_gate_up_tp_shard_holds_slice_of_gate_and_of_up():
    gate, up = torch.arange(4.0).view(4, 1), torch.arange(10.0, 14.0).view(4, 1)
    fc1 = tf.gate_up_hf_to_megatron(gate, up)
    assert tf.split_for_tp("gate_up", fc1, 0, 2).flatten().tolist() == [0, 1, 10, 11]
    assert tf.split_for_tp("gate_up", fc1, 1, 2).flatten().tolist() == [2, 3, 12, 13]


@pytest.mark.parametrize("variant", VARIANTS)
def test_shard_then_gather_is_identity(variant):
    config = _config(variant)
    hf = _random_hf(config)
    wmap = weight_map_for(config, tp_size=2)
    for name in wmap.megatron_names():
        full = wmap.to_megatron(name, [hf[n] for n in wmap.hf_names(name)])
        if wmap.is_expert(name):
            ctxs = [ShardContext(etp_rank=r, etp_size=2) for r in range(2)]
        else:
            ctxs = [ShardContext(tp_rank=r, tp_size=2) for r in range(2)]
        shards = [shard_tensor(wmap, name, full, c) for c in ctxs]
        if wmap.split_kind(name) != "replicated":
            assert shards[0].numel() == full.numel() // 2, name
        assert torch.equal(gather_tensor(wmap, name, shards), full), name


def test_row_parallel_splits_dim_1():
    wmap = weight_map_for(_config("dense"))
    full = torch.randn(64, 64)
    shard = shard_tensor(wmap, "decoder.layers.0.self_attention.linear_proj.weight", full,
                         ShardContext(tp_rank=1, tp_size=2))
    assert torch.equal(shard, full[:, 32:])


def test_global_and_local_names_under_pp_and_ep():
    ctx = ShardContext(ep_rank=1, ep_size=2, layer_offset=1, num_experts=8)
    local = "decoder.layers.0.mlp.experts.local_experts.2.linear_fc1.weight"
    full = "decoder.layers.1.mlp.experts.local_experts.6.linear_fc1.weight"
    assert global_name(local, ctx) == full
    assert local_name(full, ctx, num_local_layers=1) == local
    grouped = "decoder.layers.0.mlp.experts.linear_fc2.weight3"
    assert global_name(grouped, ctx) == "decoder.layers.1.mlp.experts.linear_fc2.weight7"
    assert local_name("decoder.layers.1.mlp.experts.local_experts.1.linear_fc1.weight", ctx, 1) is None
    assert local_name("decoder.layers.0.self_attention.linear_qkv.weight", ctx, 1) is None
    assert global_name("embedding.word_embeddings.weight", ctx) == "embedding.word_embeddings.weight"


def test_registry_is_exact_and_derives_megatron_args():
    with pytest.raises(ValueError, match="no weight map for architecture 'Qwen3MoeForCausalLMv2'"):
        model_family({"architectures": ["Qwen3MoeForCausalLMv2"]})
    with pytest.raises(ValueError, match="no 'architectures'"):
        model_family({})
    config = _config("moe", mlp_only_layers=[0])
    args = model_family(config).megatron_args(config)
    assert args["moe_layer_freq"] == [0, 1] and args["num_experts"] == 8
    assert args["num_query_groups"] == 2 and args["kv_channels"] == 16
    assert args["rotary_base"] == 1000000.0 and not args["moe_router_pre_softmax"]
    wmap = weight_map_for(config)
    assert "decoder.layers.0.mlp.linear_fc1.weight" in wmap.megatron_names()


def test_unknown_megatron_name_is_a_clear_error():
    wmap = weight_map_for(_config("dense"))
    with pytest.raises(KeyError, match="decoder.layers.0.mlp.router.weight"):
        wmap.hf_names("decoder.layers.0.mlp.router.weight")


def test_deepseek_v3_map_and_args():
    """MLA rows (TE names fuse the latent norms into the up projections), the router's expert bias,
    the shared expert, the dense first layer; args carry MLA, YaRN and group-limited sigmoid routing."""
    config = _config("deepseek_v3")
    wmap = weight_map_for(config)
    te = set(wmap.megatron_names(MegatronLayout(te_norms=True)))
    assert "decoder.layers.0.self_attention.linear_q_up_proj.layer_norm_weight" in te
    assert "decoder.layers.0.self_attention.linear_kv_up_proj.layer_norm_weight" in te
    assert "decoder.layers.0.mlp.linear_fc1.weight" in te and "decoder.layers.0.mlp.router.weight" not in te
    assert wmap.hf_names("decoder.layers.1.mlp.router.expert_bias") == ["model.layers.1.mlp.gate.e_score_correction_bias"]
    assert wmap.hf_names("decoder.layers.1.mlp.shared_experts.linear_fc1.weight") == [
        "model.layers.1.mlp.shared_experts.gate_proj.weight", "model.layers.1.mlp.shared_experts.up_proj.weight"]
    assert wmap.split_kind("decoder.layers.0.self_attention.linear_kv_down_proj.weight") == "replicated"
    args = model_family(config).megatron_args(config)
    assert args["multi_latent_attention"] and args["q_lora_rank"] == 32 and args["qk_pos_emb_head_dim"] == 8
    assert args["rope_type"] == "yarn" and args["rotary_scaling_factor"] == 4.0 and args["mscale_all_dim"] == 1.0
    assert args["moe_layer_freq"] == [0, 1] and args["moe_shared_expert_intermediate_size"] == 32
    assert args["moe_router_score_function"] == "sigmoid" and args["moe_router_enable_expert_bias"]
    assert args["moe_router_num_groups"] == 4 and args["moe_router_group_topk"] == 1
    assert args["moe_router_topk_scaling_factor"] == 2.5
    no_q_lora = _config("deepseek_v3", q_lora_rank=None)
    assert "q_lora_rank" not in model_family(no_q_lora).megatron_args(no_q_lora)
    assert "decoder.layers.0.self_attention.linear_q_proj.weight" in weight_map_for(no_q_lora).megatron_names()


@pytest.mark.parametrize("overrides, message", [
    ({"rope_interleave": False}, "rope_interleave=false"),
    ({"norm_topk_prob": False}, "norm_topk_prob=false"),
    ({"scoring_func": "softmax"}, "scoring_func='softmax'"),
    ({"topk_group": 2}, "n_group=4"),
])
def test_deepseek_v3_unsupported_configs_are_named(overrides, message):
    config = _config("deepseek_v3", **overrides)
    with pytest.raises(ValueError, match=message):
        model_family(config).megatron_args(config)


def test_glm4_moe_map_and_args():
    config = _config("glm4_moe")
    wmap = weight_map_for(config)
    assert wmap.hf_names("decoder.layers.0.self_attention.linear_qkv.bias") == [
        f"model.layers.0.self_attn.{p}_proj.bias" for p in "qkv"]
    args = model_family(config).megatron_args(config)
    assert args["rotary_percent"] == 0.5 and args["add_qkv_bias"] and args["qk_layernorm"]
    assert args["moe_layer_freq"] == [0, 1] and "moe_router_num_groups" not in args
    no_norm = _config("glm4_moe", use_qk_norm=False)
    assert not model_family(no_norm).megatron_args(no_norm)["qk_layernorm"]
    assert "decoder.layers.0.self_attention.q_layernorm.weight" not in weight_map_for(no_norm).megatron_names()


def test_deepseek_v3_map_names_exactly_the_released_kimi_k2_tensors(repo_root):
    """On the full released Kimi-K2 config (no tensor allocated), the DeepSeek-V3 map's HF names,
    with the block-FP8 scales of the weights the checkpoint quantises, are exactly the tensors of
    the released shards (tests/data/hf-configs/Kimi-K2-Instruct/weight_map_keys.txt.gz), apart from
    the multi-token-prediction layers (index >= num_hidden_layers; Kimi-K2 has none) and the
    rotary `inv_freq` buffers the original modeling code saved (no weight: loaders skip them)."""
    import gzip
    import json
    import re

    from slime.utils.fp8 import SCALE_SUFFIX, fp8_config_from_hf

    folder = repo_root / "tests" / "data" / "hf-configs" / "Kimi-K2-Instruct"
    config = json.loads((folder / "config.json").read_text())
    released = set(gzip.decompress((folder / "weight_map_keys.txt.gz").read_bytes()).decode().split())
    assert len(released) == 139_644

    wmap = weight_map_for(config)
    ours = {hf for mg in wmap.megatron_names() for hf in wmap.hf_names(mg)}
    fp8 = fp8_config_from_hf(config)
    scales = {name + SCALE_SUFFIX for name in ours if fp8.is_fp8(name)}
    layer = re.compile(r"^model\.layers\.(\d+)\.")
    mtp = {n for n in released if layer.match(n) and int(layer.match(n).group(1)) >= config["num_hidden_layers"]}
    buffers = {n for n in released if n.endswith(".self_attn.rotary_emb.inv_freq")}
    assert len(buffers) == config["num_hidden_layers"] and mtp == set()  # num_nextn_predict_layers is 0
    expected = released - mtp - buffers
    assert not ours & scales
    assert sorted((ours | scales) - expected) == [], "named by the map, absent from the release"
    assert sorted(expected - (ours | scales)) == [], "released, not named by the map"
