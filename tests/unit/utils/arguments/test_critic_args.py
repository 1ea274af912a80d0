"""Critic flags (--advantage-estimator ppo): defaults from the actor, layout checks naming the
flags, warnings when they are ignored, and the namespace the critic's ranks read."""

import pytest

from slime.utils.arguments import ArgumentError, parse_args
from slime.utils.arguments.critic import critic_view, critic_world_size


@pytest.fixture
def ppo_argv(base_argv):
    """base_argv disaggregated (1 engine GPU), ppo, lr 1e-3."""
    argv = [a for a in base_argv if a != "--colocate"]
    return argv + ["--rollout-num-gpus", "1", "--advantage-estimator", "ppo", "--lr", "1e-3"]


def test_critic_defaults_to_the_actor(ppo_argv):
    args = parse_args(ppo_argv)
    assert (args.critic_num_nodes, args.critic_num_gpus_per_node, args.critic_lr) == (1, 2, 1e-3)
    assert critic_world_size(args) == 2


def test_critic_view_swaps_in_the_critic_flags(ppo_argv, tmp_path):
    args = parse_args(ppo_argv + ["--critic-num-gpus-per-node", "1", "--critic-lr", "5e-4",
                                  "--critic-lr-warmup-iters", "3", "--critic-load", str(tmp_path / "c"),
                                  "--critic-save", str(tmp_path / "c"), "--save", str(tmp_path / "a"),
                                  "--save-hf", str(tmp_path / "hf_out")])
    view = critic_view(args)
    assert (view.actor_num_gpus_per_node, view.lr, view.lr_warmup_iters) == (1, 5e-4, 3)
    assert view.load == view.save == str(tmp_path / "c") and view.save_hf is None
    assert view.untie_embeddings_and_output_weights
    assert (args.actor_num_gpus_per_node, args.lr, args.save) == (2, 1e-3, str(tmp_path / "a"))  # untouched


def test_critic_world_must_fit_expert_parallel(ppo_argv):
    with pytest.raises(ArgumentError, match="--critic-num-nodes x --critic-num-gpus-per-node = 1 .*PP\\*EP\\*ETP"):
        parse_args(ppo_argv + ["--num-experts", "4", "--expert-model-parallel-size", "2",
                               "--critic-num-gpus-per-node", "1"])


def test_critic_dp_must_divide_global_batch(ppo_argv):
    with pytest.raises(ArgumentError, match="--global-batch-size 3 is not divisible by the critic's data-parallel"):
        parse_args(ppo_argv + ["--actor-num-gpus-per-node", "1", "--critic-num-gpus-per-node", "2",
                               "--global-batch-size", "3", "--rollout-batch-size", "3", "--n-samples-per-prompt", "1"])


def test_ppo_refuses_colocate(base_argv):
    with pytest.raises(ArgumentError, match="--advantage-estimator ppo does not support --colocate"):
        parse_args(base_argv + ["--advantage-estimator", "ppo", "--lr", "1e-3"])


def test_ppo_needs_a_learning_rate(ppo_argv):
    argv = ppo_argv[:-2]  # without --lr
    with pytest.raises(ArgumentError, match="--critic-lr"):
        parse_args(argv)
    assert parse_args(argv + ["--critic-lr", "1e-4"]).critic_lr == 1e-4


def test_critic_flags_without_ppo_are_warned(base_argv):
    args = parse_args(base_argv + ["--critic-lr", "1e-4", "--num-critic-only-steps", "2"])
    assert critic_world_size(args) == 0
    assert any("--critic-lr, --num-critic-only-steps ignored" in w for w in args.warnings), args.warnings


def test_save_without_critic_save_is_warned(ppo_argv, tmp_path):
    args = parse_args(ppo_argv + ["--save", str(tmp_path / "ckpt")])
    assert any("--critic-save" in w for w in args.warnings), args.warnings


def test_critic_load_is_never_silently_ignored(ppo_argv, tmp_path):
    hf = tmp_path / "hf_model"
    (hf / "config.json").parent.mkdir()
    (hf / "config.json").write_text("{}")
    with pytest.raises(ArgumentError, match="--critic-load .*hf_model has no latest_checkpointed_iteration.txt"):
        parse_args(ppo_argv + ["--critic-load", str(hf), "--critic-save", str(tmp_path / "c")])
    first = parse_args(ppo_argv + ["--critic-load", str(tmp_path / "c"), "--critic-save", str(tmp_path / "c")])
    assert any(w.startswith("--critic-load") and "first launch" in w for w in first.warnings)
