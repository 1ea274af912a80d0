"""The --dry-run plan of a ppo job: the critic's GPUs between the actor's and the engines', its
layout and a memory section with a verdict."""

from slime.utils.arguments import parse_args
from slime.utils.plan import build_plan, render_plan


def test_ppo_plan_shows_the_critic(tmp_path):
    (tmp_path / "hf").mkdir()
    args = parse_args(["--actor-num-gpus-per-node", "4", "--rollout-num-gpus", "2", "--num-gpus-per-node", "8",
                       "--critic-num-gpus-per-node", "2", "--hf-checkpoint", str(tmp_path / "hf"),
                       "--rollout-batch-size", "4", "--n-samples-per-prompt", "2", "--num-rollout", "1",
                       "--advantage-estimator", "ppo", "--lr", "1e-3", "--num-layers", "2", "--hidden-size", "64",
                       "--num-attention-heads", "4", "--ffn-hidden-size", "128", "--vocab-size", "128"])
    plan = build_plan(args)
    assert plan.placement.trainer_gpus == [0, 1, 2, 3] and plan.placement.critic_gpus == [4, 5]
    assert [e.gpus for e in plan.placement.engines] == [[6], [7]]
    assert plan.critic.layout.world_size == 2 and plan.critic.layout.dp == 2
    text = render_plan(plan)
    assert "critic GPUs                 : 4-5" in text
    assert "== Critic (ppo value model) memory per GPU" in text and "critic verdict              : fits" in text
