"""MoE routing replay flags: R3 implies --use-routing-replay and the engines' routed experts; the
rules that refuse what the replay cannot do name their flags."""

import pytest

from slime.utils.arguments import ArgumentError, parse_args

MOE = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "8", "--num-experts", "8"]


def test_rollout_routing_replay_asks_engines_for_routed_experts(base_argv):
    args = parse_args(base_argv + MOE + ["--use-rollout-routing-replay"])
    assert args.use_routing_replay and args.sglang_enable_return_routed_experts


def test_routing_replay_alone_leaves_the_engines_alone(base_argv):
    args = parse_args(base_argv + MOE + ["--use-routing-replay"])
    assert args.use_routing_replay and not args.sglang_enable_return_routed_experts


@pytest.mark.parametrize("extra,flags", [
    (["--use-rollout-routing-replay"], ["--use-rollout-routing-replay", "--num-experts"]),
    (MOE + ["--use-routing-replay", "--use-rollout-logprobs"],
     ["--use-routing-replay", "--use-rollout-logprobs", "--use-rollout-routing-replay"]),
])
def test_unsupported_combinations_name_their_flags(base_argv, extra, flags):
    with pytest.raises(ArgumentError) as info:
        parse_args(base_argv + extra)
    for flag in flags:
        assert flag in str(info.value)
