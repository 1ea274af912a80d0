"""TRL's GRPOTrainer on the tiny model and the parity data: the peer `tools/bench_vs_trl.py` times.

Runs inside the throw-away TRL venv (`bench_vs_trl.py --install-trl` makes it); it imports TRL,
transformers and torch only, never slime. Usage:

    <trl-venv>/bin/python tools/trl_grpo_peer.py --model HF_DIR --data TRAIN_JSONL --steps N \
        --started-at EPOCH_S --output result.json

The same batch as `scripts/run-tiny-moe-cpu.sh` (parity): 32 prompts x 8 samples per step, one
optimizer step per batch, one-token responses at temperature 1, the chat template, the exact-match
reward on the label, lr 2e-3 constant, Adam betas (0.9, 0.98), no weight decay, clip 0.2 / 0.28,
no KL term (our job's --kl-loss-coef 0: TRL then builds no reference model), grad-norm clip 1.0,
no dropout. `--started-at` is the wall time (time.time()) at which the caller started this
command; the result holds the wall time at the end of every optimizer step and the mean reward
per step.
"""

from __future__ import annotations

import argparse
import json
import time

BATCH, N_SAMPLES, LR = 32, 8, 2e-3


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="HF checkpoint folder (tools/make_tiny_model.py)")
    parser.add_argument("--data", required=True, help="train.jsonl of tools/make_toy_data.py (prompt, label)")
    parser.add_argument("--steps", type=int, required=True, help="optimizer steps (= rollouts)")
    parser.add_argument("--started-at", type=float, required=True, help="time.time() when the command started")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--output", required=True, help="JSON result file")
    return parser.parse_args(argv)


def main(argv=None) -> None:
    opts = parse_args(argv)
    imported_at = time.time()
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(opts.threads)
    with open(opts.data) as f:
        rows = [json.loads(line) for line in f]
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": r["prompt"]}], "label": r["label"]}
                                 for r in rows[:opts.steps * BATCH]])
    step_ends: list[float] = []
    rewards: list[float] = []

    def exact_match(completions, label, **_):
        return [float(c[0]["content"] == lab) for c, lab in zip(completions, label)]

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            step_ends.append(time.time())

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "reward" in logs:
                rewards.append(float(logs["reward"]))

    config = GRPOConfig(
        output_dir=f"{opts.output}.trainer", use_cpu=True, bf16=False, fp16=False, seed=0,
        per_device_train_batch_size=BATCH * N_SAMPLES, gradient_accumulation_steps=1, num_generations=N_SAMPLES,
        max_completion_length=1, temperature=1.0, learning_rate=LR, lr_scheduler_type="constant",
        adam_beta1=0.9, adam_beta2=0.98, weight_decay=0.0, max_grad_norm=1.0, beta=0.0, num_iterations=1,
        epsilon=0.2, epsilon_high=0.28, max_steps=opts.steps, logging_steps=1, save_strategy="no",
        report_to="none", shuffle_dataset=True, disable_dropout=True, dataloader_num_workers=0,
    )
    trainer = GRPOTrainer(model=opts.model, reward_funcs=exact_match, args=config, train_dataset=dataset,
                          callbacks=[Clock()])
    built_at = time.time()
    trainer.train()
    done_at = time.time()
    result = {"started_at": opts.started_at, "imported_at": imported_at, "built_at": built_at, "done_at": done_at,
              "step_ends": step_ends, "rewards": rewards, "steps": opts.steps}
    with open(opts.output, "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
