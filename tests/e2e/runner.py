"""Helpers of the end-to-end tests: the tiny-MoE GRPO argv (the flags of
scripts/run-tiny-moe-cpu.sh, sized for tests), the HF -> torch_dist conversion, running
`train.py` / `train_async.py` as a subprocess with a timeout, and reading `metrics.jsonl`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]

# scripts/models/qwen3-tiny-moe.sh, as a list (the tests do not source bash).
MODEL_ARGS = [
    "--disable-bias-linear", "--qk-layernorm", "--group-query-attention",
    "--num-attention-heads", "4", "--num-query-groups", "2", "--kv-channels", "16",
    "--num-layers", "2", "--hidden-size", "64", "--ffn-hidden-size", "128",
    "--normalization", "RMSNorm", "--position-embedding-type", "rope", "--norm-epsilon", "1e-6",
    "--rotary-percent", "1.0", "--swiglu", "--untie-embeddings-and-output-weights",
    "--vocab-size", "128", "--rotary-base", "1000000",
    "--moe-ffn-hidden-size", "32", "--moe-router-score-function", "softmax",
    "--moe-token-dispatcher-type", "allgather", "--moe-router-topk", "2",
    "--moe-layer-freq", "[1]*2", "--num-experts", "8", "--moe-router-dtype", "fp32",
    "--moe-aux-loss-coeff", "0", "--transformer-impl", "local",
]


def subprocess_env() -> dict[str, str]:
    """The environment of every child: one OpenMP thread, the repo importable, no GPU."""
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO_ROOT), CUDA_VISIBLE_DEVICES="")
    env.pop("RAY_ADDRESS", None)
    return env


def run_python(argv: list[str], log_path: Path, timeout: float, python: str = sys.executable) -> None:
    """Run `python <argv>` in the repo root, stdout+stderr to `log_path`; raise with the log's
    tail when it fails or runs past `timeout` seconds."""
    with open(log_path, "w") as log:
        try:
            proc = subprocess.run([python, *argv], cwd=REPO_ROOT, env=subprocess_env(),
                                  stdout=log, stderr=subprocess.STDOUT, timeout=timeout)
            code = proc.returncode
        except subprocess.TimeoutExpired:
            code = f"timeout after {timeout:.0f}s"
    if code != 0:
        tail = log_path.read_text()[-6000:]
        raise AssertionError(f"python {argv[0]} failed ({code}); log {log_path}:\n{tail}")


def convert_checkpoint(hf_dir: Path, out_dir: Path, timeout: float = 300) -> Path:
    """HF checkpoint -> torch_dist under `out_dir` (one rank, the session's warm python); returns `out_dir`."""
    from tests.warm_python import warm_python

    run_python(["tools/convert_hf_to_torch_dist.py", *MODEL_ARGS, "--hf-checkpoint", str(hf_dir),
                "--save", str(out_dir)], out_dir.parent / f"{out_dir.name}.log", timeout, python=warm_python())
    if not (out_dir / "latest_checkpointed_iteration.txt").is_file():
        raise AssertionError(f"conversion wrote no {out_dir}/latest_checkpointed_iteration.txt")
    return out_dir


def grpo_argv(hf_dir: Path, ref_dir: Path, data_dir: Path, run_dir: Path, num_rollout: int,
              lr: float = 1e-2, extra: list[str] | None = None) -> list[str]:
    """train.py flags of the tiny-MoE GRPO run (2 trainer ranks, EP=2, one local engine) with
    metrics in `run_dir/metrics` and checkpoints in `run_dir/ckpt`. 16 prompts x 8 samples."""
    return [
        "--actor-num-nodes", "1", "--actor-num-gpus-per-node", "2", "--rollout-num-gpus", "1",
        *MODEL_ARGS,
        "--hf-checkpoint", str(hf_dir), "--ref-load", str(ref_dir), "--save", str(run_dir / "ckpt"),
        "--metrics-dir", str(run_dir / "metrics"),
        "--prompt-data", str(data_dir / "train.jsonl"), "--input-key", "prompt", "--label-key", "label",
        "--apply-chat-template", "--rollout-shuffle", "--rm-type", "math",
        "--num-rollout", str(num_rollout), "--rollout-batch-size", "16", "--n-samples-per-prompt", "8",
        "--rollout-max-response-len", "1", "--rollout-temperature", "1.0", "--global-batch-size", "128",
        "--tensor-model-parallel-size", "1", "--expert-model-parallel-size", "2",
        "--use-dynamic-batch-size", "--max-tokens-per-gpu", "2048",
        "--advantage-estimator", "grpo", "--eps-clip", "0.2", "--eps-clip-high", "0.28",
        "--use-kl-loss", "--kl-loss-coef", "0.0", "--kl-loss-type", "low_var_kl", "--entropy-coef", "0.0",
        "--optimizer", "adam", "--lr", str(lr), "--lr-decay-style", "constant", "--weight-decay", "0.0",
        "--adam-beta1", "0.9", "--adam-beta2", "0.98",
        "--rollout-num-gpus-per-engine", "1",
        "--attention-dropout", "0.0", "--hidden-dropout", "0.0",
        "--accumulate-allreduce-grads-in-fp32", "--attention-softmax-in-fp32",
        "--distributed-backend", "gloo", "--seed", "1234",
        *(extra or []),
    ]


def run_train(argv: list[str], run_dir: Path, entry: str = "train.py", timeout: float = 240) -> list[dict]:
    """Run `entry` with `argv` (log in `run_dir/<entry>.log`); returns the metrics rows."""
    run_dir.mkdir(parents=True, exist_ok=True)
    run_python([entry, *argv], run_dir / f"{Path(entry).stem}.log", timeout)
    return read_metrics(run_dir / "metrics" / "metrics.jsonl")


def read_metrics(path: Path) -> list[dict]:
    """The rows of a metrics.jsonl, in file order."""
    if not path.is_file():
        raise AssertionError(f"no metrics file at {path}")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def rollout_rows(rows: list[dict]) -> dict[int, dict]:
    """rollout_id -> its row, for rows that carry a rollout (not the final eval-only row)."""
    return {r["rollout_id"]: r for r in rows if "rollout/raw_reward" in r}
