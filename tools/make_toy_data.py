"""The toy RL tasks on numbers n in 0..999, chosen by `--task` (registry `TASKS`):

- `parity` (default): `"{n} mod 2"` -> `"0"` or `"1"`. The answer is one character, so one token
  of the tiny tokenizer (tools/make_tiny_model.py), and the `math` reward scores it by exact match.
- `parity_twice`: `"{n} mod 2 twice"` -> `"00"` or `"11"`, then the end-of-turn token: the
  multi-token task (3 response tokens with <|im_end|>). The `char_match` reward gives a finished
  response partial credit per position and for stopping right after the answer, a cut one 0.
- `mod3`: `"{n}%3"` -> `"0"`, `"1"` or `"2"`: the tool-use task of examples/tool_use (the
  remainder depends on every digit, so the tiny model answers it by calling the calculator on the
  question; `calculator_task.py` there).

Owns the prompt pools, their seeded train/eval split and the JSONL files `train.jsonl` /
`eval.jsonl` (rows `{"prompt": "347 mod 2", "label": "1", "metadata": {"task", "n", "question"}}`;
`question` is the prompt before any chat template, for tools that answer it). A random
tiny model starts near chance (about 1/vocab = 1/128 per sampled token, not 1/2: it must first
learn to answer with a digit at all). The parity rules depend only on the last digit, so
held-out numbers test the same rule on unseen prompt strings.

Why parity: with 32 prompts x 8 samples, one-token responses and Adam lr 2e-3, the tiny MoE
reaches mean reward >= 0.9 in about 40-55 GRPO steps (tools/check_toy_learnability.py); a
ten-way answer (successor of a digit, next digit of a run) needs 70 to over 100 steps and some
seeds stall with a prompt stuck on a wrong answer.

Usage: python tools/make_toy_data.py --output-dir DIR [--task parity] [--seed 0] [--num-train N]
       [--num-eval M]
"""

import argparse
import json
import logging
import random
from pathlib import Path

logger = logging.getLogger(__name__)

MAX_NUMBER = 999
# Numbers held out for eval (a seeded choice); the rest are train prompts.
NUM_EVAL_NUMBERS = 100


def _parity(n: int) -> tuple[str, str]:
    return f"{n} mod 2", str(n % 2)


def _parity_twice(n: int) -> tuple[str, str]:
    return f"{n} mod 2 twice", str(n % 2) * 2


def _mod3(n: int) -> tuple[str, str]:
    return f"{n}%3", str(n % 3)


# task name -> n -> (prompt, label)
TASKS = {"parity": _parity, "parity_twice": _parity_twice, "mod3": _mod3}


def make_row(n: int, task: str = "parity") -> dict:
    """Return the row of `task` for number `n` (e.g. parity: prompt "{n} mod 2", label "0"/"1")."""
    prompt, label = TASKS[task](n)
    return {"prompt": prompt, "label": label, "metadata": {"task": task, "n": n, "question": prompt}}


def prompt_pool(task: str = "parity") -> list[dict]:
    """Return every distinct row of `task`, n = 0..MAX_NUMBER in order."""
    return [make_row(n, task) for n in range(MAX_NUMBER + 1)]


def split_pool(seed: int, task: str = "parity") -> tuple[list[dict], list[dict]]:
    """Split the pool into disjoint (train, eval) row lists, seeded; eval has NUM_EVAL_NUMBERS rows.

    Eval holds as many even as odd numbers, so its chance level is the same for both labels. The
    split depends on the seed only, so every task holds out the same numbers.
    """
    rng = random.Random(seed)
    pool = prompt_pool(task)
    rng.shuffle(pool)
    even = [r for r in pool if r["metadata"]["n"] % 2 == 0]
    eval_rows = even[: NUM_EVAL_NUMBERS // 2]
    eval_rows += [r for r in pool if r["metadata"]["n"] % 2 == 1][: NUM_EVAL_NUMBERS - len(eval_rows)]
    held_out = {r["prompt"] for r in eval_rows}
    train_rows = [r for r in pool if r["prompt"] not in held_out]
    return train_rows, sorted(eval_rows, key=lambda r: r["metadata"]["n"])


def _repeat_to(rows: list[dict], n: int, rng: random.Random) -> list[dict]:
    """Return `n` rows: whole shuffled passes over `rows`, the last one cut short."""
    out = []
    while len(out) < n:
        batch = list(rows)
        rng.shuffle(batch)
        out.extend(batch)
    return out[:n]


def make_toy_data(output_dir, seed: int = 0, num_train: int = 4096, num_eval: int | None = None,
                  task: str = "parity") -> Path:
    """Write `task`'s train.jsonl (`num_train` rows) and eval.jsonl into `output_dir`; return the Path.

    Train rows go through the train prompts in seeded shuffled passes. Eval holds each held-out
    prompt once unless `num_eval` asks for a different count. No prompt string is in both files.
    """
    if num_train < 1:
        raise ValueError(f"--num-train must be >= 1, got {num_train}")
    if task not in TASKS:
        raise ValueError(f"--task {task!r} is not one of {sorted(TASKS)}")
    train_rows, eval_rows = split_pool(seed, task)
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
    """Parse the command line of this tool."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output-dir", required=True, help="folder to write train.jsonl and eval.jsonl into")
    parser.add_argument("--task", default="parity", choices=sorted(TASKS),
                        help="parity: one-token answers 0/1; parity_twice: 00/11 then end of turn; "
                        "mod3: n%%3, answered with the calculator (examples/tool_use)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the train/eval split and row order")
    parser.add_argument("--num-train", type=int, default=4096, help="rows in train.jsonl (prompts repeat)")
    parser.add_argument("--num-eval", type=int, default=None,
                        help="rows in eval.jsonl (default: each held-out prompt once)")
    return parser.parse_args(argv)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    cli = _parse_args()
    make_toy_data(cli.output_dir, seed=cli.seed, num_train=cli.num_train, num_eval=cli.num_eval, task=cli.task)
