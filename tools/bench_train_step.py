"""Benchmark: tokens/s of the Megatron train step vs a plain transformers step on the same model.

Usage: `python tools/bench_train_step.py [--hf-dir DIR] [--iterations 5] [--warmup 1]
[--batch 8] [--seq-len 64] [--output bench.json]`. Without `--hf-dir` a tiny Qwen3 MoE is made in
a temporary folder (tools/make_tiny_model.py). One rank (gloo), fp32, a fixed batch.

- megatron: `MegatronTrainer.train(rollout_id, batch)`: old log-probs (forward only; the pass
  is forced, where a run of one step per rollout would skip it, so both sides do the same work),
  GRPO advantages, forward/backward, optimizer step (megatron's Adam through DDP).
- transformers: the same work with `AutoModelForCausalLM`: a no-grad forward (old log-probs),
  forward/backward of the masked response log-likelihood, `torch.optim.Adam` step.

Prints a table (median seconds per step, tokens/s) with the ratio megatron/transformers and
writes it as JSON. Absolute times on shared machines are noise; the ratio in one run is the number
to compare. The work stays under the `__main__` guard (spawned helpers re-import this file).
"""

import argparse
import importlib.util
import json
import logging
import statistics
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RL_FLAGS = [
    "--num-rollout", "1", "--lr", "1e-4", "--lr-decay-style", "constant", "--weight-decay", "0",
    "--attention-dropout", "0", "--hidden-dropout", "0", "--advantage-estimator", "grpo",
    "--optimizer", "adam", "--distributed-backend", "gloo", "--transformer-impl", "local",
    "--moe-token-dispatcher-type", "allgather", "--moe-router-dtype", "fp32", "--seed", "1234",
    "--actor-num-nodes", "1", "--actor-num-gpus-per-node", "1", "--rollout-num-gpus", "1",
]


def parse_args(argv=None) -> argparse.Namespace:
    """Benchmark flags."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hf-dir", default=None, help="HF checkpoint (default: a fresh tiny Qwen3 MoE).")
    parser.add_argument("--iterations", type=int, default=5, help="Timed steps per backend.")
    parser.add_argument("--warmup", type=int, default=1, help="Untimed steps per backend first.")
    parser.add_argument("--batch", type=int, default=8, help="Samples per step (even).")
    parser.add_argument("--seq-len", type=int, default=64, help="Tokens per sample (half response).")
    parser.add_argument("--output", default="bench_train_step.json", help="JSON result file.")
    return parser.parse_args(argv)


def fixed_batch(vocab: int, batch: int, seq_len: int) -> dict:
    """`batch` samples of `seq_len` tokens, the second half the response, +-1 rewards."""
    import torch

    g = torch.Generator().manual_seed(0)
    response = seq_len // 2
    return {
        "tokens": [torch.randint(0, vocab, (seq_len,), generator=g).tolist() for _ in range(batch)],
        "response_lengths": [response] * batch,
        "rewards": [1.0 if i % 2 else -1.0 for i in range(batch)],
        "loss_masks": [[1] * response for _ in range(batch)],
    }


def _model_flags(hf_dir: str) -> list[str]:
    """MODEL_ARGS for the HF config (from the weight-map registry)."""
    from slime.backends.megatron_utils.hf_io import read_hf_config
    from slime.backends.megatron_utils.hf_loader import model_flags_from_hf_config

    return model_flags_from_hf_config(read_hf_config(hf_dir))


def megatron_step_times(hf_dir: str, batch: dict, iterations: int, warmup: int) -> list[float]:
    """Seconds of each timed `MegatronTrainer.train` call on one gloo rank."""
    from slime.backends.megatron_utils.actor import MegatronTrainer
    from slime.backends.megatron_utils.hf_io import HFCheckpoint, read_hf_config
    from slime.backends.megatron_utils.hf_loader import load_hf_weights, shard_context_for
    from slime.backends.megatron_utils.parallel import destroy_parallel, initialize_megatron
    from slime.models import validate_hf_checkpoint, weight_map_for
    from slime.utils.arguments import parse_args as slime_args

    n = len(batch["tokens"])
    args = slime_args(_model_flags(hf_dir) + RL_FLAGS + [
        "--hf-checkpoint", hf_dir, "--prompt-data", str(Path(hf_dir) / "config.json"),
        "--rollout-batch-size", str(n // 2), "--n-samples-per-prompt", "2", "--global-batch-size", str(n),
        "--micro-batch-size", str(n)], model_check=validate_hf_checkpoint)
    initialize_megatron(args, rank=0, world_size=1)
    trainer = MegatronTrainer(args)
    trainer.reuse_train_log_probs = False  # the old-policy pass runs, as the transformers side's no-grad forward
    cfg = read_hf_config(hf_dir)
    wmap = weight_map_for(cfg, args.make_vocab_size_divisible_by, 1)
    ctx = shard_context_for(trainer.model, cfg.get("num_experts") or 0)
    load_hf_weights(trainer.model, HFCheckpoint(hf_dir), wmap, ctx)
    times = []
    for i in range(warmup + iterations):
        data = {k: list(v) for k, v in batch.items()}
        start = time.perf_counter()
        trainer.train(i, data)
        times.append(time.perf_counter() - start)
    destroy_parallel()
    return times[warmup:]


def _response_logprob(model, tokens, response: int):
    import torch

    logits = model(input_ids=tokens).logits[:, :-1].float()
    logp = torch.log_softmax(logits, dim=-1).gather(-1, tokens[:, 1:, None])[..., 0]
    return logp[:, -response:]


def hf_step_times(hf_dir: str, batch: dict, iterations: int, warmup: int) -> list[float]:
    """Seconds of each timed transformers step (no-grad forward, forward/backward, Adam)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    model.train()
    optim = torch.optim.Adam(model.parameters(), lr=1e-4)
    tokens = torch.tensor(batch["tokens"])
    response = batch["response_lengths"][0]
    rewards = torch.tensor(batch["rewards"])[:, None]
    times = []
    for _ in range(warmup + iterations):
        start = time.perf_counter()
        with torch.no_grad():
            old = _response_logprob(model, tokens, response)
        new = _response_logprob(model, tokens, response)
        loss = -(torch.exp(new - old) * rewards).mean()
        optim.zero_grad()
        loss.backward()
        optim.step()
        times.append(time.perf_counter() - start)
    return times[warmup:]


def summarize(batch: dict, megatron: list[float], hf: list[float]) -> dict:
    """Median seconds, tokens/s per backend and the megatron/transformers tokens/s ratio."""
    tokens = sum(len(t) for t in batch["tokens"])
    rows = {}
    for name, times in (("megatron", megatron), ("transformers", hf)):
        median = statistics.median(times)
        rows[name] = {"median_s": median, "tokens_per_s": tokens / median, "iterations": len(times)}
    ratio = rows["megatron"]["tokens_per_s"] / rows["transformers"]["tokens_per_s"]
    return {"tokens_per_step": tokens, "backends": rows, "ratio_megatron_over_transformers": ratio}


def render(result: dict) -> str:
    """The result as a text table."""
    lines = [f"{'backend':<14}{'median s/step':>15}{'tokens/s':>12}",
             *(f"{n:<14}{r['median_s']:>15.4f}{r['tokens_per_s']:>12.1f}" for n, r in result["backends"].items()),
             f"ratio megatron/transformers (tokens/s): {result['ratio_megatron_over_transformers']:.3f}"
             f"  ({result['tokens_per_step']} tokens per step)"]
    return "\n".join(lines)


def _tiny_moe(out_dir: Path) -> str:
    spec = importlib.util.spec_from_file_location("make_tiny_model", REPO / "tools" / "make_tiny_model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return str(module.make_tiny_model(out_dir, variant="moe", seed=0))


def main(argv=None) -> dict:
    """Run both backends, print the table, write the JSON; returns the result dict."""
    opts = parse_args(argv)
    if opts.batch < 2 or opts.batch % 2:
        raise SystemExit(f"--batch {opts.batch}: need an even number >= 2 (2 samples per prompt)")
    with tempfile.TemporaryDirectory() as tmp:
        hf_dir = opts.hf_dir or _tiny_moe(Path(tmp) / "tiny_moe")
        vocab = json.loads((Path(hf_dir) / "config.json").read_text())["vocab_size"]
        batch = fixed_batch(vocab, opts.batch, opts.seq_len)
        megatron = megatron_step_times(hf_dir, batch, opts.iterations, opts.warmup)
        hf = hf_step_times(hf_dir, batch, opts.iterations, opts.warmup)
    result = summarize(batch, megatron, hf)
    result["config"] = vars(opts)
    print(render(result))
    Path(opts.output).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    main()
