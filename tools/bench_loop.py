"""Benchmark: wall time per rollout of our RL loop vs a plain transformers GRPO loop, one run.

Usage: `python tools/bench_loop.py [--rollouts 8] [--warmup 2] [--work-dir DIR] [--output
bench_loop.json] [-- extra train.py flags]`.

Both loops train the tiny Qwen3-MoE (tools/make_tiny_model.py, seed 0) on the toy parity task
(tools/make_toy_data.py, seed 0) with 32 prompts x 8 samples of one-token responses per step,
lr 2e-3, as `scripts/run-tiny-moe-cpu.sh` does:

- ours: `train.py`'s loop (Ray, 2 gloo trainer ranks with EP2 and dynamic batches, one local
  engine, the job's flags of the script minus eval and checkpoints), timed per rollout from the
  driver: generate, train, weight sync, plus the ranks' own `perf/*` phases (log-probs, train).
- plain: `tools/check_toy_learnability.py`'s `grpo_step` (one forward, sampling, loss, backward,
  Adam) on the same checkpoint and prompts, in this process, one thread (`--plain-threads`; our
  ranks and engine run one each). Its steps run between our rollouts, so both see the same load.

The first `--warmup` steps of each are not counted. Prints per-phase medians and the ratio of
median wall seconds per step ours / plain, and writes them as JSON. Absolute times on shared
machines are noise; the ratio within one run is the number to compare. The work stays under the
`__main__` guard (spawned helpers re-import this file).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BATCH, N_SAMPLES, LR = 32, 8, 2e-3
# scripts/run-tiny-moe-cpu.sh (parity) without eval, checkpoints and metric sinks
LOOP_FLAGS = [
    "--input-key", "prompt", "--label-key", "label", "--apply-chat-template", "--rollout-shuffle",
    "--rm-type", "math", "--rollout-batch-size", str(BATCH), "--n-samples-per-prompt", str(N_SAMPLES),
    "--rollout-max-response-len", "1", "--rollout-temperature", "1.0", "--global-batch-size", str(BATCH * N_SAMPLES),
    "--tensor-model-parallel-size", "1", "--expert-model-parallel-size", "2", "--use-dynamic-batch-size",
    "--max-tokens-per-gpu", "2048", "--advantage-estimator", "grpo", "--eps-clip", "0.2", "--eps-clip-high", "0.28",
    "--use-kl-loss", "--kl-loss-coef", "0.0", "--kl-loss-type", "low_var_kl", "--entropy-coef", "0.0",
    "--optimizer", "adam", "--lr", str(LR), "--lr-decay-style", "constant", "--weight-decay", "0.0",
    "--adam-beta1", "0.9", "--adam-beta2", "0.98", "--rollout-num-gpus-per-engine", "1",
    "--attention-dropout", "0.0", "--hidden-dropout", "0.0", "--accumulate-allreduce-grads-in-fp32",
    "--attention-softmax-in-fp32", "--distributed-backend", "gloo", "--seed", "1234",
    "--actor-num-nodes", "1", "--actor-num-gpus-per-node", "2", "--rollout-num-gpus", "1",
    "--rollout-group-requests",  # one /generate per group, as the script sends (docs/performance.md)
]
# the ranks' own phases (perf/* metrics of a rollout) reported next to the driver's
RANK_PHASES = ("perf/rollout_time", "perf/log_probs_time", "perf/train_time", "perf/update_weights_time")


def parse_args(argv=None) -> argparse.Namespace:
    """Benchmark flags; anything after `--` is appended to train.py's flags."""
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=8, help="timed steps per loop (after the warm-up)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed first steps per loop")
    parser.add_argument("--plain-threads", type=int, default=1, help="torch threads of the plain loop")
    parser.add_argument("--work-dir", default=None, help="model, data and torch_dist folder (reused; default: temporary)")
    parser.add_argument("--output", default="bench_loop.json", help="JSON result file")
    opts = parser.parse_args(argv)
    if opts.rollouts < 1 or opts.warmup < 0:
        parser.error("--rollouts must be >= 1 and --warmup >= 0")
    opts.extra = extra
    return opts


def _load_tool(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_loop_{name}", REPO / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def prepare(work: Path) -> tuple[Path, Path, Path]:
    """(HF checkpoint, train.jsonl, torch_dist) of the tiny MoE and the parity task, made once."""
    hf, data, dist = work / "hf", work / "data", work / "torch_dist"
    if not (hf / "model.safetensors").exists():
        _load_tool("make_tiny_model").make_tiny_model(hf, variant="moe", seed=0)
    if not (data / "train.jsonl").exists():
        _load_tool("make_toy_data").make_toy_data(data, seed=0, num_train=4096)
    if not (dist / "latest_checkpointed_iteration.txt").exists():
        subprocess.run([sys.executable, str(REPO / "tools" / "convert_hf_to_torch_dist.py"), *model_flags(hf),
                        "--hf-checkpoint", str(hf), "--save", str(dist)], check=True, cwd=REPO)
    return hf, data / "train.jsonl", dist


def model_flags(hf: Path) -> list[str]:
    """MODEL_ARGS for the HF config (from the weight-map registry)."""
    from slime.backends.megatron_utils.hf_io import read_hf_config
    from slime.backends.megatron_utils.hf_loader import model_flags_from_hf_config

    cpu = ["--transformer-impl", "local", "--moe-token-dispatcher-type", "allgather", "--moe-router-dtype", "fp32"]
    return model_flags_from_hf_config(read_hf_config(str(hf))) + cpu  # as scripts/models/qwen3-tiny-moe.sh


def _timed(row: dict, key: str, fn, *args):
    start = time.perf_counter()
    out = fn(*args)
    row[key] = time.perf_counter() - start
    return out


def timed_train_loop(args, rows: list[dict], between) -> None:
    """train.py's synchronous loop without eval and checkpoints; one row of phase seconds per
    rollout. `between()` runs after each rollout (the plain loop's step: both see the same load)."""
    from slime.ray.job import ActorSide, JobScope, RolloutSide

    with JobScope(args) as job:
        rollout = job.start(RolloutSide)
        actor = job.start(ActorSide)
        actor.init(rollout)
        actor.sync_weights(rollout, version=0)
        for rollout_id in range(args.num_rollout):
            row: dict = {}
            start = time.perf_counter()
            data, metrics = _timed(row, "generate", rollout.generate, rollout_id)
            metrics |= actor.onload_if_colocated(rollout)
            metrics |= _timed(row, "train", actor.train, rollout_id, data)
            metrics |= _timed(row, "sync_weights", actor.sync_weights, rollout, rollout_id + 1)
            row["wall"] = time.perf_counter() - start
            row |= {k: metrics[k] for k in RANK_PHASES if k in metrics}
            row["reward"] = metrics.get("rollout/raw_reward")
            rows.append(row)
            between()


class PlainLoop:
    """The plain transformers GRPO loop on the same checkpoint and prompts, one `step()` at a time
    (`--plain-threads` torch threads; our trainer ranks and engine run one thread each)."""

    def __init__(self, hf: Path, train: Path, threads: int, batch: int = BATCH):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.toy = _load_tool("check_toy_learnability")
        torch.set_num_threads(threads)
        torch.manual_seed(0)
        self.tokenizer = AutoTokenizer.from_pretrained(hf)
        self.model = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=LR, betas=(0.9, 0.98))
        self.gen = torch.Generator().manual_seed(0)
        self.data = [json.loads(x) for x in train.read_text().splitlines()]
        self.rows: list[dict] = []
        self.batch = batch

    def step(self) -> None:
        row: dict = {}
        start = time.perf_counter()
        step = len(self.rows)
        chunk = self.data[step * self.batch:(step + 1) * self.batch]
        prompts, labels = _timed(row, "encode", self.toy.encode_prompts, self.tokenizer, chunk)
        row["reward"] = _timed(row, "grpo_step", self.toy.grpo_step, self.model, self.optimizer, prompts, labels,
                               N_SAMPLES, self.gen)
        row["wall"] = time.perf_counter() - start
        self.rows.append(row)


def run_both(hf: Path, train: Path, dist: Path, steps: int, opts) -> tuple[list[dict], list[dict]]:
    """Per-step phase rows of our loop (train.py with the tiny CPU job's flags) and of the plain
    loop, whose steps run between our rollouts."""
    sys.path.insert(0, str(REPO))
    import train as train_py

    plain = PlainLoop(hf, train, opts.plain_threads)
    rows: list[dict] = []
    argv = [*model_flags(hf), *LOOP_FLAGS, "--hf-checkpoint", str(hf), "--ref-load", str(dist),
            "--prompt-data", str(train), "--num-rollout", str(steps), *opts.extra]
    code = train_py.main(argv, loop=lambda args: timed_train_loop(args, rows, plain.step))
    if code:
        raise SystemExit(f"our loop failed (exit code {code})")
    return rows, plain.rows


def summarize(ours: list[dict], plain: list[dict], warmup: int) -> dict:
    """Median seconds of every phase per loop (after `warmup` steps) and the wall-time ratio."""
    def medians(rows):
        rows = rows[warmup:]
        keys = [k for k in rows[0] if k != "reward"]
        return {k: statistics.median(r[k] for r in rows if r.get(k) is not None) for k in keys}

    result = {"ours": medians(ours), "plain": medians(plain), "steps": len(ours) - warmup, "warmup": warmup}
    result["ratio_wall_ours_over_plain"] = result["ours"]["wall"] / result["plain"]["wall"]
    result["rewards"] = {"ours": [r.get("reward") for r in ours], "plain": [r["reward"] for r in plain]}
    return result


def render(result: dict) -> str:
    """The result as a text table (median seconds per step and phase)."""
    lines = [f"median seconds per step over {result['steps']} steps (after {result['warmup']} warm-up)"]
    for name in ("ours", "plain"):
        lines.append(f"{name:<6}" + "  ".join(f"{k} {v:.3f}" for k, v in result[name].items()))
    lines.append(f"ratio ours/plain (wall s/step): {result['ratio_wall_ours_over_plain']:.3f}")
    return "\n".join(lines)


def main(argv=None) -> dict:
    """Run both loops, print the table, write the JSON; returns the result dict."""
    opts = parse_args(argv)
    steps = opts.warmup + opts.rollouts
    with tempfile.TemporaryDirectory() as tmp:
        hf, train, dist = prepare(Path(opts.work_dir or tmp))
        ours, plain = run_both(hf, train, dist, steps, opts)
    result = summarize(ours, plain, opts.warmup)
    result["config"] = {"rollouts": opts.rollouts, "warmup": opts.warmup, "plain_threads": opts.plain_threads,
                        "extra": opts.extra}
    print(render(result))
    Path(opts.output).write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    main()
