"""Run the Megatron trainer on N gloo processes for tests: build args from a tiny HF checkpoint,
load its weights through the weight maps, train on a fixed batch, and write what each rank saw.

Worker functions are top-level so `tests.spawn_ranks.spawn_ranks` can pickle them; results come back
as JSON files written by rank 0 (the metrics are the same on every rank by construction).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from slime.utils.misc import free_port
from tests.spawn_ranks import spawn_ranks

TINY_RL_ARGS = [
    "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--global-batch-size", "4",
    "--num-rollout", "1", "--lr", "1e-2", "--lr-decay-style", "constant", "--weight-decay", "0",
    "--attention-dropout", "0", "--hidden-dropout", "0", "--advantage-estimator", "grpo",
    "--entropy-coef", "0.01", "--optimizer", "adam", "--distributed-backend", "gloo",
    "--transformer-impl", "local", "--moe-token-dispatcher-type", "allgather", "--moe-router-dtype", "fp32",
    "--clip-grad", "1.0", "--seed", "1234",
]


def model_argv(hf_dir: str) -> list[str]:
    """MODEL_ARGS flags equivalent to the HF config (through the weight-map registry)."""
    from slime.backends.megatron_utils.hf_io import read_hf_config
    from slime.backends.megatron_utils.hf_loader import model_flags_from_hf_config

    return model_flags_from_hf_config(read_hf_config(hf_dir))


def fixed_rollout_data(with_rollout_log_probs: bool = False) -> dict:
    """4 samples of different lengths with uneven, already-normalised rewards (optionally with
    engine log-probs, for --use-tis / --use-rollout-logprobs)."""
    g = torch.Generator().manual_seed(0)
    lengths, responses = (7, 9, 5, 8), (3, 4, 2, 3)
    data = {
        "tokens": [torch.randint(0, 96, (n,), generator=g).tolist() for n in lengths],
        "response_lengths": list(responses),
        "rewards": [1.0, -0.3, 0.7, -0.2],
        "loss_masks": [[1] * r for r in responses],
    }
    if with_rollout_log_probs:
        data["rollout_log_probs"] = [[-4.5] * r for r in responses]
    return data


def build_trainer(hf_dir: str, world: int, extra: list[str], rank: int, port: int):
    """Parse args, start megatron, build the trainer and load the HF weights into it."""
    from slime.backends.megatron_utils.actor import MegatronTrainer
    from slime.backends.megatron_utils.hf_io import HFCheckpoint, read_hf_config
    from slime.backends.megatron_utils.hf_loader import load_hf_weights, shard_context_for
    from slime.backends.megatron_utils.parallel import initialize_megatron
    from slime.models import weight_map_for
    from slime.utils.arguments import parse_args

    argv = model_argv(hf_dir) + TINY_RL_ARGS + [
        "--hf-checkpoint", hf_dir, "--prompt-data", str(Path(hf_dir) / "config.json"),
        "--actor-num-nodes", "1", "--actor-num-gpus-per-node", str(world), "--rollout-num-gpus", "1",
    ] + extra
    args = parse_args(argv)
    initialize_megatron(args, rank=rank, world_size=world, master_addr="127.0.0.1", master_port=port)
    trainer = MegatronTrainer(args)
    cfg = read_hf_config(hf_dir)
    wmap = weight_map_for(cfg, args.make_vocab_size_divisible_by, args.tensor_model_parallel_size)
    load_hf_weights(trainer.model, HFCheckpoint(hf_dir), wmap, shard_context_for(trainer.model, cfg.get("num_experts", 0) or 0))
    return args, trainer


def _train_worker(rank: int, world: int, port: int, hf_dir: str, extra: list[str], out: str, rollouts: int,
                  with_rollout_log_probs: bool = False):
    torch.manual_seed(0)
    _, trainer = build_trainer(hf_dir, world, extra, rank, port)
    results = [trainer.train(i, fixed_rollout_data(with_rollout_log_probs)) for i in range(rollouts)]
    if rank == 0:
        Path(out).write_text(json.dumps(results))
    from slime.backends.megatron_utils.parallel import destroy_parallel

    destroy_parallel()


def train_metrics(hf_dir, world: int, extra: list[str], tmp_path, rollouts: int = 1, tag: str = "run",
                  with_rollout_log_probs: bool = False) -> list[dict]:
    """Metrics of `rollouts` train calls on `world` gloo ranks with layout flags `extra`."""
    out = Path(tmp_path) / f"{tag}.json"
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    spawn_ranks(_train_worker, args=(world, free_port(), str(hf_dir), extra, str(out), rollouts, with_rollout_log_probs),
             nprocs=world, join=True)
    return json.loads(out.read_text())


def _logprob_shift_worker(rank: int, world: int, port: int, hf_dir: str, extra: list[str], out: str):
    _, trainer = build_trainer(hf_dir, world, extra, rank, port)
    data = fixed_rollout_data()
    mine = list(range(len(data["tokens"])))
    before = trainer.compute_log_prob(data, mine)["log_probs"]
    metrics = trainer.train(0, fixed_rollout_data())
    after = trainer.compute_log_prob(data, mine)["log_probs"]
    if rank == 0:
        shift = [float((after[i] - before[i]).sum()) for i in mine]
        Path(out).write_text(json.dumps({"metrics": metrics, "shift": shift, "rewards": data["rewards"]}))


def logprob_shift(hf_dir, tmp_path, extra: list[str] | None = None) -> dict:
    """Summed change of each sample's response log-prob after one GRPO step (1 rank)."""
    out = Path(tmp_path) / "shift.json"
    spawn_ranks(_logprob_shift_worker, args=(1, free_port(), str(hf_dir), extra or [], str(out)), nprocs=1, join=True)
    return json.loads(out.read_text())
