"""Issue 13's model flags on the local spec (CPU): each reaches the built GPTModel and changes it as
megatron-core defines; `--spec MODULE FUNCTION` is loaded and called as slime does."""

import argparse

import pytest
import torch

from tests.unit.backends.megatron_utils.spawn_util import spawn

FIXTURES = "tests.unit.backends.megatron_utils.layer_spec_fixtures"
TINY = ("--num-layers 2 --hidden-size 64 --ffn-hidden-size 128 --num-attention-heads 4 --group-query-attention "
        "--num-query-groups 2 --normalization RMSNorm --swiglu --disable-bias-linear --position-embedding-type rope "
        "--vocab-size 128 --transformer-impl local --attention-dropout 0 --hidden-dropout 0 "
        "--actor-num-nodes 1 --actor-num-gpus-per-node 1 --debug-train-only --rollout-batch-size 1 --num-rollout 1")
MOE = "--num-experts 4 --moe-ffn-hidden-size 32 --moe-router-topk 2 --moe-shared-expert-intermediate-size 32"
VARIANTS = {
    "base": "", "interleaved": "--rotary-interleaved", "gate": "--attention-output-gate",
    "gated_alias": "--use-gated-attention", "1p": "--apply-layernorm-1p",
    "spec": f"--spec {FIXTURES} post_norm_spec --post-mlp-layernorm --post-self-attn-layernorm",
    "moe": MOE, "moe_gate": MOE + " --moe-shared-expert-gate",
}


def _build_all(rank, world_size):
    from slime.backends.megatron_utils.model_provider import build_model_for_stage
    from slime.backends.megatron_utils.parallel import initialize_megatron, set_random_seed
    from slime.utils.arguments import parse_args
    from tests.unit.backends.megatron_utils import layer_spec_fixtures

    out = {}
    ids = torch.randint(0, 128, (1, 12), generator=torch.Generator().manual_seed(0))
    pos = torch.arange(12).unsqueeze(0)
    causal = torch.ones(12, 12, dtype=torch.bool).triu(1).expand(1, 1, 12, 12)
    for name, extra in VARIANTS.items():
        args = parse_args((TINY + " " + extra).split())
        if not out:
            initialize_megatron(args)
        set_random_seed(1234)
        model = build_model_for_stage(args).eval()
        with torch.no_grad():
            logits = model(ids, pos, attention_mask=causal)
        params = {k: tuple(v.shape) for k, v in model.state_dict().items() if v is not None and hasattr(v, "shape")}
        out[name] = {"logits": logits, "params": params, "config": model.config}
    out["spec_calls"] = list(layer_spec_fixtures.CALLS)
    return out


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return spawn(_build_all, 1, tmp_path_factory.mktemp("variants"))[0]


def test_model_flags_reach_the_built_model(built):
    base = built["base"]
    assert torch.isfinite(base["logits"]).all()
    qkv = "decoder.layers.0.self_attention.linear_qkv.weight"
    # interleaved RoPE: same weights (same seed), other rotation -> other logits
    assert built["interleaved"]["config"].rotary_interleaved
    assert built["interleaved"]["params"] == base["params"]
    assert not torch.allclose(built["interleaved"]["logits"], base["logits"])
    # output gate: the QKV projection also yields the gate (one more head-dim per query head)
    for name in ("gate", "gated_alias"):
        assert built[name]["config"].attention_output_gate
        assert built[name]["params"][qkv][0] == base["params"][qkv][0] + 64
    # zero-centred norms start at 0, so with the other weights equal the logits are the same
    assert built["1p"]["config"].layernorm_zero_centered_gamma
    torch.testing.assert_close(built["1p"]["logits"], base["logits"])
    # shared-expert gate: a gate weight only with the flag
    gate = "decoder.layers.0.mlp.shared_experts.gate_weight"
    assert gate in built["moe_gate"]["params"] and gate not in built["moe"]["params"]


def test_spec_function_builds_the_layers(built):
    """--spec ran our function with (args, config, vp_stage) and the model follows its spec."""
    assert built["spec_calls"] == [(2, "TransformerConfig", None)]
    norm = "decoder.layers.0.pre_mlp_layernorm.weight"
    assert norm in built["base"]["params"] and norm not in built["spec"]["params"]


def _spec_args():
    return argparse.Namespace(num_layers=2, post_mlp_layernorm=False)


@pytest.mark.parametrize("spec, error, message", [
    (["no_such_module_xyz", "fn"], ImportError, "--spec no_such_module_xyz fn: cannot import module"),
    ([FIXTURES, "missing"], AttributeError, f"module '{FIXTURES}' has no attribute 'missing'"),
    ([FIXTURES, "raising_spec"], RuntimeError, r"raising_spec\(args, config, vp_stage\) raised KeyError"),
    ([FIXTURES, "NOT_A_SPEC"], TypeError, "expected a ModuleSpec or TransformerBlockSubmodules, got int"),
    ([FIXTURES, "not_a_spec_fn"], TypeError, "got str"),
])
def test_spec_errors_name_the_flag_and_module(spec, error, message):
    from slime.backends.megatron_utils.layer_specs import load_layer_spec

    with pytest.raises(error, match=message):
        load_layer_spec(spec, _spec_args(), config=None)


def test_spec_may_name_a_spec_object():
    """slime also accepts a ModuleSpec attribute, used as is (Megatron-LM's original --spec)."""
    from slime.backends.megatron_utils.layer_specs import load_layer_spec
    from tests.unit.backends.megatron_utils.layer_spec_fixtures import local_layer_spec

    spec = load_layer_spec([FIXTURES, "LOCAL_LAYER_SPEC"], _spec_args(), config=None)
    assert spec is local_layer_spec()
