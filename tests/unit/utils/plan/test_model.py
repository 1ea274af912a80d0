"""Parameter counts: a small dense shape by hand, megatron-core's own count, MoE layer patterns."""

import json
import subprocess
import textwrap
from argparse import Namespace

import pytest

from slime.utils.plan.model import ModelShape, active_params, shape_from_args, total_params
from tests.warm_python import warm_python


def _shape(**kw) -> ModelShape:
    base = dict(num_layers=2, hidden=64, ffn_hidden=256, num_heads=4, num_kv_groups=2, head_dim=16, vocab=100,
                untied=False, swiglu=False, norm_weights=2, qk_norm=False, linear_bias=True, qkv_bias=False,
                num_experts=0, moe_ffn_hidden=0, topk=0, moe_layers=(False, False), shared_expert_ffn=0,
                shared_expert_gate=False)
    base.update(kw)
    return ModelShape(**base)


def test_small_dense_shape_by_hand():
    # Attention: q 64x64 + k,v 2 x 64x32 + o 64x64 = 12,288; biases q 64 + k,v 64 + o 64 = 192;
    # input LayerNorm weight+bias 128 -> 12,608. MLP: 64x256 + 256x64 = 32,768, biases 256 + 64,
    # pre-MLP LayerNorm 128 -> 33,216. Layer 45,824; 2 layers 91,648; tied embedding 100x64 = 6,400;
    # final LayerNorm 128. Total 98,176.
    counts = total_params(_shape())
    assert counts.total == 98_176
    assert counts.expert == 0 and counts.replicated == 2 * (128 + 128) + 128
    assert active_params(_shape()) == 98_176


def test_shape_from_args_resolves_megatron_defaults():
    args = Namespace(num_layers=4, hidden_size=64, num_attention_heads=4, vocab_size=100, swiglu=True,
                     ffn_hidden_size=None, num_query_groups=None, kv_channels=None, num_experts=8,
                     moe_layer_freq=2, moe_router_topk=2, moe_ffn_hidden_size=32)
    shape = shape_from_args(args)
    assert shape.ffn_hidden == 128  # int(4*64*2/3 / 64) * 64
    assert shape.num_kv_groups == 4 and shape.head_dim == 16
    assert shape.moe_layers == (True, False, True, False)  # megatron: layer i is MoE when i % 2 == 0


def test_shape_from_args_names_missing_flag():
    with pytest.raises(ValueError, match="--hidden-size"):
        shape_from_args(Namespace(num_layers=2, hidden_size=None, num_attention_heads=4, vocab_size=10))


def test_moe_layer_freq_length_must_match():
    args = Namespace(num_layers=3, hidden_size=64, num_attention_heads=4, vocab_size=100, num_experts=4,
                     moe_layer_freq=[1, 1])
    with pytest.raises(ValueError, match="--moe-layer-freq"):
        shape_from_args(args)


_MEGATRON_COUNT = textwrap.dedent("""
    import json, sys, tempfile, torch
    import torch.nn.functional as F
    torch.distributed.init_process_group("gloo", init_method="file://" + tempfile.mktemp(), rank=0, world_size=1)
    from megatron.core import parallel_state
    parallel_state.initialize_model_parallel()
    from megatron.core.transformer import TransformerConfig
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    out = {}
    moe = TransformerConfig(num_layers=2, hidden_size=64, ffn_hidden_size=96, num_attention_heads=4,
        num_query_groups=2, kv_channels=16, normalization="RMSNorm", qk_layernorm=True, gated_linear_unit=True,
        activation_func=F.silu, add_bias_linear=False, num_moe_experts=4, moe_ffn_hidden_size=32,
        moe_router_topk=2, moe_shared_expert_intermediate_size=48, use_cpu_initialization=True,
        moe_token_dispatcher_type="allgather", attention_output_gate=True, moe_shared_expert_gate=True)
    spec = get_gpt_layer_local_spec(num_experts=4, qk_layernorm=True, normalization="RMSNorm")
    model = GPTModel(config=moe, transformer_layer_spec=spec, vocab_size=100, max_sequence_length=32,
                     share_embeddings_and_output_weights=False, position_embedding_type="rope")
    out["moe"] = sum(p.numel() for p in model.parameters())
    dense = TransformerConfig(num_layers=2, hidden_size=64, ffn_hidden_size=256, num_attention_heads=4,
        num_query_groups=2, kv_channels=16, add_bias_linear=True, use_cpu_initialization=True)
    model = GPTModel(config=dense, transformer_layer_spec=get_gpt_layer_local_spec(), vocab_size=100,
                     max_sequence_length=32, share_embeddings_and_output_weights=True, position_embedding_type="rope")
    out["dense"] = sum(p.numel() for p in model.parameters())
    print(json.dumps(out))
""")


def test_counts_match_megatron_gptmodel():
    # Run in a child process: it initialises a 1-rank gloo group and megatron's global state.
    proc = subprocess.run([warm_python(), "-c", _MEGATRON_COUNT], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    counts = json.loads(proc.stdout.strip().splitlines()[-1])
    moe = _shape(ffn_hidden=96, swiglu=True, norm_weights=1, qk_norm=True, linear_bias=False, untied=True,
                 num_experts=4, moe_ffn_hidden=32, topk=2, moe_layers=(True, True), shared_expert_ffn=48,
                 output_gate=True, shared_expert_gate=True)  # --attention-output-gate, --moe-shared-expert-gate
    assert total_params(moe).total == counts["moe"]
    assert total_params(_shape()).total == counts["dense"]
