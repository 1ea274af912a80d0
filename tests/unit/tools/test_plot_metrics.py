"""tools/plot_metrics.py: reads reward/eval series from metrics.jsonl, names bad lines, writes a PNG."""

import json

import pytest

from tests.conftest import load_tool


def test_series_and_png(tmp_path):
    tool = load_tool("plot_metrics")
    rows = [
        {"rollout_id": 0, "rollout/raw_reward": 0.1, "eval/toy": 0.05, "eval/toy/truncated_ratio": 1.0},
        {"rollout_id": 1, "rollout/raw_reward": 0.6, "train/loss": 0.3},
        {"rollout_id": 2, "eval/toy": 0.9},
        {"rollout_id": 1, "rollout/raw_reward": 0.7},  # a resumed run repeats rollout 1
    ]
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    series = tool.read_series(path)
    assert series == {"rollout/raw_reward": [(0, 0.1), (1, 0.7)], "eval/toy": [(0, 0.05), (2, 0.9)]}
    tool.plot(series, tmp_path / "curve.png", "t")
    assert (tmp_path / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_line_names_file_and_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"rollout_id": 0}\n{oops\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: not JSON"):
        load_tool("plot_metrics").read_series(path)
