"""The PPO critic on gloo ranks: the value model starts from the actor's torch_dist checkpoint
(every weight but the value head), its values and value-loss steps agree between one rank and
TP=2 with sequence parallelism (the head's gather), its loss falls on a fixed batch, and a critic
resumed from its --critic-save checkpoint gives the saved critic's values."""

import json
from pathlib import Path

import pytest
import torch

from slime.utils.misc import free_port
from tests.distributed.megatron_harness import TINY_RL_ARGS, fixed_rollout_data, model_argv
from tests.spawn_ranks import spawn_ranks

pytestmark = pytest.mark.distributed

STEPS = 3


def _critic_worker(rank: int, world: int, port: int, hf_dir: str, ref_dir: str, extra: list[str], out: str):
    from slime.backends.megatron_utils.critic import MegatronCritic
    from slime.backends.megatron_utils.model import unwrap
    from slime.backends.megatron_utils.parallel import destroy_parallel, initialize_megatron
    from slime.utils.arguments import parse_args

    args = parse_args(model_argv(hf_dir) + TINY_RL_ARGS + [
        "--hf-checkpoint", hf_dir, "--prompt-data", str(Path(hf_dir) / "config.json"), "--ref-load", ref_dir,
        "--actor-num-nodes", "1", "--actor-num-gpus-per-node", str(world), "--rollout-num-gpus", "1",
        "--advantage-estimator", "ppo", "--critic-lr", "1e-3", "--gamma", "1.0", "--lambd", "0.9"] + extra)
    initialize_megatron(args, rank=rank, world_size=world, master_addr="127.0.0.1", master_port=port)
    critic = MegatronCritic(args)
    critic.load_initial_state()
    head = unwrap(critic.state.model[0]).output_layer  # the same head on every layout
    with torch.no_grad():
        head.weight.copy_(torch.randn(head.weight.shape, generator=torch.Generator().manual_seed(0)) * 0.05)
        head.bias.fill_(0.1)
    results = []
    for step in range(STEPS):
        data = fixed_rollout_data()
        data["values"] = critic.compute_values(data)
        metrics = critic.train(step, data)
        results.append({"values": [v.tolist() for v in data["values"]], "metrics": metrics})
    if args.critic_save:  # resume: a new critic from the checkpoint sees what the trained one sees
        critic.save(STEPS - 1)
        args.critic_load = args.critic_save
        resumed = MegatronCritic(args)
        assert resumed.load_initial_state() == STEPS
        data = fixed_rollout_data()
        results.append({"trained": [v.tolist() for v in critic.compute_values(data)],
                        "resumed": [v.tolist() for v in resumed.compute_values(data)]})
    if rank == 0:
        Path(out).write_text(json.dumps(results))
    destroy_parallel()


def _run(hf_dir, ref_dir, world: int, extra: list[str], out: Path) -> list[dict]:
    spawn_ranks(_critic_worker, args=(world, free_port(), str(hf_dir), str(ref_dir), extra, str(out)),
             nprocs=world, join=True)
    return json.loads(out.read_text())


def test_critic_layouts_agree_and_value_loss_falls(tiny_moe_hf, tiny_moe_torch_dist, tmp_path):
    ref = tiny_moe_torch_dist
    one = _run(tiny_moe_hf, ref, 1, ["--critic-save", str(tmp_path / "critic")], tmp_path / "one.json")
    resume = one.pop()
    assert resume["resumed"] == resume["trained"]
    two = _run(tiny_moe_hf, ref, 2, ["--tensor-model-parallel-size", "2", "--sequence-parallel"],
               tmp_path / "tp2.json")
    for step, (a, b) in enumerate(zip(one, two)):
        for va, vb in zip(a["values"], b["values"]):
            assert vb == pytest.approx(va, rel=1e-4, abs=1e-5), f"step {step}: values differ between layouts"
        assert b["metrics"]["critic/value_loss"] == pytest.approx(a["metrics"]["critic/value_loss"], rel=1e-4)
    losses = [r["metrics"]["critic/value_loss"] for r in one]
    assert all(later < earlier for earlier, later in zip(losses, losses[1:])), losses
    # values are per response token and move between steps (the model trains)
    assert [len(v) for v in one[0]["values"]] == fixed_rollout_data()["response_lengths"]
    assert one[1]["values"] != one[0]["values"]
