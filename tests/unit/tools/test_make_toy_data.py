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
        number, rest = row["prompt"].split(" ", 1)
        assert rest == "mod 2" and int(number) == row["metadata"]["n"]
        assert row["label"] == str(int(number) % 2)
    assert {r["label"] for r in train} == {"0", "1"}
    assert sum(r["label"] == "1" for r in evals) == len(evals) // 2


def test_eval_prompts_are_disjoint_from_train_and_labels_are_covered(toy_data):
    train, evals = _rows(toy_data / "train.jsonl"), _rows(toy_data / "eval.jsonl")
    train_prompts = {r["prompt"] for r in train}
    assert not train_prompts & {r["prompt"] for r in evals}
    assert len(evals) == toy.NUM_EVAL_NUMBERS == len({r["prompt"] for r in evals})
    assert len(toy.split_pool(0)[0]) + len(evals) == len(toy.prompt_pool())


def test_prompts_use_only_tokenizer_characters(toy_data, tiny_moe_hf):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_moe_hf)
    for row in _rows(toy_data / "eval.jsonl"):
        assert tok.unk_token_id not in tok(row["prompt"])["input_ids"]
        assert tok(row["label"])["input_ids"] == [int(row["label"])]  # the answer is one token


def test_bad_num_train_names_the_flag(tmp_path):
    import pytest

    with pytest.raises(ValueError, match="--num-train"):
        toy.make_toy_data(tmp_path, num_train=0)


def test_same_seed_same_files(tmp_path):
    a = toy.make_toy_data(tmp_path / "a", seed=3, num_train=50, num_eval=20)
    b = toy.make_toy_data(tmp_path / "b", seed=3, num_train=50, num_eval=20)
    for name in ("train.jsonl", "eval.jsonl"):
        assert (a / name).read_bytes() == (b / name).read_bytes()
    assert len(_rows(a / "eval.jsonl")) == 20


def test_parity_twice_task_has_two_token_labels_and_the_same_split(tmp_path, tiny_moe_hf):
    from transformers import AutoTokenizer

    out = toy.make_toy_data(tmp_path, seed=0, num_train=64, task="parity_twice")
    train, evals = _rows(out / "train.jsonl"), _rows(out / "eval.jsonl")
    for row in train + evals:
        n = row["metadata"]["n"]
        assert row["prompt"] == f"{n} mod 2 twice" and row["label"] == str(n % 2) * 2
        assert row["metadata"]["task"] == "parity_twice"
    parity_eval = {r["metadata"]["n"] for r in toy.split_pool(0)[1]}
    assert {r["metadata"]["n"] for r in evals} == parity_eval  # same held-out numbers as parity
    assert sum(r["label"] == "11" for r in evals) == len(evals) // 2
    tok = AutoTokenizer.from_pretrained(tiny_moe_hf)
    for row in evals:  # several tokens per answer, none unknown
        ids = tok(row["label"])["input_ids"]
        assert len(ids) == len(row["label"]) > 1 and tok.unk_token_id not in ids
