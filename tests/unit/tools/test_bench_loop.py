"""tools/bench_loop.py without its Ray job: flags train.py accepts, the plain loop's step rows,
the summary's shape and ratio (no timing is asserted)."""

import json

import pytest

from tests.conftest import load_tool

bench = load_tool("bench_loop")


def test_extra_flags_after_double_dash():
    opts = bench.parse_args(["--rollouts", "3", "--warmup", "1", "--", "--kl-loss-coef", "0.1"])
    assert (opts.rollouts, opts.warmup, opts.plain_threads) == (3, 1, 1)
    assert opts.extra == ["--kl-loss-coef", "0.1"]
    with pytest.raises(SystemExit):
        bench.parse_args(["--rollouts", "0"])


def test_loop_flags_are_a_valid_train_py_job(tiny_moe_hf, tmp_path, capsys):
    """The job the benchmark runs passes train.py's validation (its --dry-run plan)."""
    import train as train_py

    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps({"prompt": "3 mod 2", "label": "1"}) + "\n")
    argv = [*bench.model_flags(tiny_moe_hf), *bench.LOOP_FLAGS, "--hf-checkpoint", str(tiny_moe_hf),
            "--ref-load", str(tmp_path / "torch_dist"), "--prompt-data", str(data), "--num-rollout", "2", "--dry-run"]
    assert train_py.main(argv) == 0
    assert "sglang command" in capsys.readouterr().out


def test_plain_loop_steps_and_summary(tiny_moe_hf, tmp_path):
    rows = [{"prompt": f"{n} mod 2", "label": str(n % 2)} for n in range(4)]
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in rows))
    plain = bench.PlainLoop(tiny_moe_hf, train, threads=1, batch=2)
    plain.step()
    plain.step()
    assert [set(r) for r in plain.rows] == [{"encode", "grpo_step", "wall", "reward"}] * 2
    assert all(0.0 <= r["reward"] <= 1.0 and r["wall"] >= r["grpo_step"] for r in plain.rows)
    ours = [{"generate": 2.0, "train": 1.0, "wall": w, "perf/log_probs_time": 0.5, "reward": 0.1} for w in (9.0, 4.0, 6.0)]
    result = bench.summarize(ours, plain.rows + [dict(plain.rows[0], wall=2.0)], warmup=1)
    assert result["steps"] == 2 and result["ours"]["wall"] == 5.0
    assert result["ratio_wall_ours_over_plain"] == 5.0 / result["plain"]["wall"]
    assert set(result["ours"]) == {"generate", "train", "wall", "perf/log_probs_time"}
    assert "ratio ours/plain (wall s/step)" in bench.render(result)
