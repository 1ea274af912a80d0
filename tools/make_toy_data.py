"""The toy RL task: continue a run of consecutive digits with the next digit.

Owns the prompt pool, its train/eval split and the JSONL files `train.jsonl` / `eval.jsonl`
(rows `{"prompt": "3 4 5", "label": "6", "metadata": {...}}`). The answer is one character, so
it is one token of the tiny tokenizer (tools/make_tiny_model.py), and the `math` reward scores
it by exact match. A random tiny model starts near chance (about 1/vocab per sampled token); the
rule depends only on the last digit, so held-out runs (other start, other length) test the same
rule on unseen prompt strings.

Usage: python tools/make_toy_data.py --output-dir DIR [--seed 0] [--num-train N] [--num-eval M]
"""

import argparse
import json
import logging
import random
from pathlib import Path

logger = logging.getLogger(__name__)

TASK_NAME = "next_digit"
MAX_RUN_LENGTH = 6
# One prompt in this many goes to eval (a seeded choice), the rest to train.
EVAL_FRACTION_DENOMINATOR = 4


def prompt_pool() -> list[dict]:
    """Return every distinct row: runs of 1..MAX_RUN_LENGTH consecutive digits ending at <= 8."""
    rows = []
    for length in range(1, MAX_RUN_LENGTH + 1):
        for start in range(0, 10 - length):
            run = list(range(start, start + length))
            rows.append({
                "prompt": " ".join(str(d) for d in run),
                "label": str(run[-1] + 1),
                "metadata": {"task": TASK_NAME, "start": start, "length": length},
            })
    return rows


def split_pool(seed: int) -> tuple[list[dict], list[dict]]:
    """Split the pool into disjoint (train, eval) prompt lists, seeded.

    Every label appears in train, so eval asks only for answers the policy can have learned.
    """
    rng = random.Random(seed)
    pool = prompt_pool()
    rng.shuffle(pool)
    n_eval = len(pool) // EVAL_FRACTION_DENOMINATOR
    eval_rows, train_rows = [], []
    for row in pool:
        wants_eval = len(eval_rows) < n_eval
        label_elsewhere = any(r["label"] == row["label"] for r in train_rows)
        (eval_rows if wants_eval and label_elsewhere else train_rows).append(row)
    return train_rows, eval_rows


def _repeat_to(rows: list[dict], n: int, rng: random.Random) -> list[dict]:
    """Return `n` rows: whole shuffled passes over `rows`, the last one cut short."""
    out = []
    while len(out) < n:
        batch = list(rows)
        rng.shuffle(batch)
        out.extend(batch)
    return out[:n]


def make_toy_data(output_dir, seed: int = 0, num_train: int = 4096, num_eval: int | None = None) -> Path:
    """Write train.jsonl (`num_train` rows) and eval.jsonl into `output_dir`; return the Path.

    Train rows cycle through the train prompts in seeded shuffled passes. Eval holds each eval
    prompt once unless `num_eval` asks for a different count. No prompt string is in both files.
    """
    if num_train < 1:
        raise ValueError(f"--num-train must be >= 1, got {num_train}")
    train_rows, eval_rows = split_pool(seed)
    rng = random.Random(seed + 1)
    train = _repeat_to(train_rows, num_train, rng)
    evals = eval_rows if num_eval is None else _repeat_to(eval_rows, num_eval, rng)
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name, rows in (("train.jsonl", train), ("eval.jsonl", evals)):
        path = out / name
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        logger.info("wrote %s (%d rows)", path, len(rows))
    return out


def _parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output-dir", required=True, help="folder to write train.jsonl and eval.jsonl into")
    parser.add_argument("--seed", type=int, default=0, help="seed of the train/eval split and row order")
    parser.add_argument("--num-train", type=int, default=4096, help="rows in train.jsonl (prompts repeat)")
    parser.add_argument("--num-eval", type=int, default=None,
                        help="rows in eval.jsonl (default: each held-out prompt once)")
    return parser.parse_args(argv)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    cli = _parse_args()
    make_toy_data(cli.output_dir, seed=cli.seed, num_train=cli.num_train, num_eval=cli.num_eval)
