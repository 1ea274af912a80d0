"""Tests for tools/make_toy_data.py: row format, correct labels, disjoint split, determinism."""

import json

from tests.conftest import load_tool

toy = load_tool("make_toy_data")


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_rows_have_correct_labels_and_fit_the_tokenizer(toy_data):
    train, evals = _rows(toy_data / "train.jsonl"), _rows(toy_data / "eval.jsonl")
    assert len(train) == 256 and len(evals) > 0
    for row in train + evals:
        assert set(row) == {"prompt", "label", "metadata"}
        digits = [int(d) for d in row["prompt"].split(" ")]
        assert digits == list(range(digits[0], digits[0] + len(digits)))
        assert row["label"] == str(digits[-1] + 1) and len(row["label"]) == 1


def test_eval_prompts_are_disjoint_from_train_and_labels_are_covered(toy_data):
    train, evals = _rows(toy_data / "train.jsonl"), _rows(toy_data / "eval.jsonl")
    train_prompts = {r["prompt"] for r in train}
    assert not train_prompts & {r["prompt"] for r in evals}
    assert {r["label"] for r in evals} <= {r["label"] for r in train}
    assert len(train_prompts) + len(evals) == len(toy.prompt_pool())


def test_same_seed_same_files(tmp_path):
    a = toy.make_toy_data(tmp_path / "a", seed=3, num_train=50, num_eval=20)
    b = toy.make_toy_data(tmp_path / "b", seed=3, num_train=50, num_eval=20)
    for name in ("train.jsonl", "eval.jsonl"):
        assert (a / name).read_bytes() == (b / name).read_bytes()
    assert len(_rows(a / "eval.jsonl")) == 20
