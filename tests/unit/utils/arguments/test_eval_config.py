"""--eval-config: per-dataset settings resolved at parse time (dataset > defaults > flags)."""

import json
from types import SimpleNamespace

import pytest
import yaml

from slime.utils.arguments import ArgumentError, parse_args
from slime.utils.eval_config import EvalDatasetConfig, build_eval_dataset_configs, ensure_dataset_list


def test_eval_config_precedence_and_prompt_data_rewrite(base_argv, tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text("{}\n")
    b.write_text("{}\n")
    cfg = {"eval": {"defaults": {"temperature": 0.6, "n_samples_per_eval_prompt": 4},
                    "datasets": [{"name": "aime", "path": str(a), "temperature": 1.0, "rm_type": "math",
                                  "metadata_overrides": {"difficulty": "hard"}},
                                 {"name": "gsm", "path": str(b), "input_key": "question"}]}}
    path = tmp_path / "eval.yaml"
    path.write_text(yaml.safe_dump(cfg))
    args = parse_args(base_argv + ["--eval-config", str(path), "--input-key", "prompt", "--eval-top-p", "0.9",
                                   "--eval-prompt-data", "old", str(a)])
    aime, gsm = args.eval_datasets
    assert args.eval_prompt_data == ["aime", str(a), "gsm", str(b)]
    assert (aime.temperature, gsm.temperature) == (1.0, 0.6)  # dataset > defaults
    assert aime.n_samples_per_eval_prompt == gsm.n_samples_per_eval_prompt == 4
    assert (aime.input_key, gsm.input_key) == ("prompt", "question")  # flag fallback
    assert aime.top_p == gsm.top_p == 0.9 and aime.max_response_len == args.rollout_max_response_len
    assert aime.inject_metadata({"x": 1}) == {"x": 1, "rm_type": "math", "difficulty": "hard"}
    assert aime.cache_key == ("aime", str(a), "prompt", args.label_key, args.tool_key, args.metadata_key)


def test_eval_datasets_always_set_and_lone_path_is_aime(base_argv, tmp_path):
    a = tmp_path / "a.jsonl"
    a.write_text("{}\n")
    args = parse_args(base_argv + ["--eval-prompt-data", str(a), "--eval-label-key", "answer"])
    assert args.eval_prompt_data == ["aime", str(a)]
    [aime] = args.eval_datasets
    assert aime.name == "aime" and aime.label_key == "answer"
    assert parse_args(base_argv).eval_datasets == []


def test_bad_eval_config_is_a_flag_error(base_argv, tmp_path):
    path = tmp_path / "eval.json"
    path.write_text(json.dumps({"datasets": []}))
    with pytest.raises(ArgumentError, match="--eval-config"):
        parse_args(base_argv + ["--eval-config", str(path)])
    path.write_text(json.dumps({"datasets": [{"name": "x", "path": str(path), "nonsense": 1}]}))
    with pytest.raises(ArgumentError, match="nonsense"):
        parse_args(base_argv + ["--eval-config", str(path)])


def test_helpers():
    assert ensure_dataset_list({"a": {"path": "p"}}) == [{"name": "a", "path": "p"}]
    with pytest.raises(ValueError):
        ensure_dataset_list([{"path": "p"}])
    with pytest.raises(ValueError, match="defaults"):
        build_eval_dataset_configs(SimpleNamespace(), [{"name": "a", "path": "p"}], {"bogus": 1})
    with pytest.raises(ValueError, match="min_eval_samples"):
        EvalDatasetConfig(name="a", path="p", min_eval_samples=0)
