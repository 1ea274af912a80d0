"""tools/bench_vs_trl.py without running either trainer: flags, the TRL venv check, the per-step
and start-up arithmetic of the summary (no timing is asserted)."""

import os

import pytest

from tests.conftest import load_tool

bench = load_tool("bench_vs_trl")


def test_flags_and_extra_train_flags():
    opts = bench.parse_args(["--short", "3", "--long", "7", "--", "--kl-loss-coef", "0.1"])
    assert (opts.short, opts.long, opts.extra) == (3, 7, ["--kl-loss-coef", "0.1"])
    for bad in (["--short", "5", "--long", "5"], ["--short", "0"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)


def test_missing_trl_venv_is_refused_naming_the_flag(tmp_path):
    with pytest.raises(SystemExit, match="--trl-venv .*--install-trl"):
        bench.trl_python(tmp_path / "no-venv", install=False)


def test_summary_cancels_start_up():
    """Per step = (long wall - short wall) / (long - short); start-up = first step done - one step."""
    runs = {
        "ours-2": {"wall": 30.0, "step_ends": [21.0, 23.0], "rewards": [0.1, 0.2]},
        "ours-5": {"wall": 36.0, "step_ends": [22.0, 24.0, 26.5, 28.5, 30.0], "rewards": [0.1] * 5},
        "trl-2": {"wall": 12.0, "step_ends": [9.0, 10.0], "rewards": [0.0, 0.1]},
        "trl-5": {"wall": 15.0, "step_ends": [9.5, 10.5, 11.0, 12.0, 13.0], "rewards": [0.0] * 5},
    }
    result = bench.summarize(runs, 2, 5)
    assert result["ours"]["step"] == pytest.approx(2.0) and result["trl"]["step"] == pytest.approx(1.0)
    # start-up: first step done minus one step, the step being the median interval (2.0 and 1.0)
    assert result["ours"]["startup"] == pytest.approx(19.0) and result["trl"]["startup"] == pytest.approx(8.0)
    assert result["ours"]["fixed"] == pytest.approx(26.0)
    # median of the long run's intervals after its first two steps: ours 2.5, 2.0, 1.5; TRL 0.5, 1.0, 1.0
    assert result["ours"]["step_median"] == pytest.approx(2.0) and result["trl"]["step_median"] == pytest.approx(1.0)
    assert result["ratio_step_median"] == pytest.approx(2.0)
    assert result["ratio_step"] == pytest.approx(2.0) and result["ratio_startup"] == pytest.approx(19.0 / 8.0)
    result |= {"load_before": [1.0, 1.0, 1.0], "load_after": [2.0, 2.0, 2.0]}
    assert "ratio ours/TRL: per step 2.00" in bench.render(result)


def test_a_long_run_faster_than_the_short_one_is_flagged():
    """When the load drops during the run, the difference of walls goes negative: said, not hidden."""
    runs = {
        "ours-2": {"wall": 40.0, "step_ends": [21.0, 23.0], "rewards": []},
        "ours-5": {"wall": 36.0, "step_ends": [20.0, 22.0, 24.0, 26.0, 28.0], "rewards": []},
        "trl-2": {"wall": 12.0, "step_ends": [9.0, 10.0], "rewards": []},
        "trl-5": {"wall": 15.0, "step_ends": [9.5, 10.5, 11.5, 12.5, 13.5], "rewards": []},
    }
    result = bench.summarize(runs, 2, 5) | {"load_before": [9.0] * 3, "load_after": [3.0] * 3}
    assert result["ours"]["step"] < 0 and result["ours"]["startup"] == pytest.approx(19.0)
    assert "per-step figures by difference are meaningless" in bench.render(result)


def test_our_job_does_the_peers_work_without_a_reference_pass():
    """TRL runs with beta=0 (no reference model) on the whole batch at once: our flags lose the KL
    loss and its values and hold a rank's share in one micro-batch, nothing else."""
    flags = ["--lr", "2e-3", "--use-kl-loss", "--kl-loss-coef", "0.0", "--kl-loss-type", "low_var_kl",
             "--entropy-coef", "0.0"]
    assert bench.same_work_as_trl(flags) == ["--lr", "2e-3", "--entropy-coef", "0.0"]
    loop_flags = load_tool("bench_loop").LOOP_FLAGS
    kept = bench.same_work_as_trl(loop_flags)
    assert "--use-kl-loss" in loop_flags and not set(bench.KL_FLAGS) & set(kept)
    assert len(loop_flags) - len(kept) == 5
    # one micro-batch per rank, as the peer's one pass over the batch
    assert kept[kept.index("--max-tokens-per-gpu") + 1] == bench.ONE_PASS_TOKENS
    assert "2048" in loop_flags and "2048" not in kept


def test_step_ends_are_the_write_times_of_the_metrics_rows(tmp_path):
    """Each new row is dated by the file's modification time when its size changed, not by when
    the poll saw it; rows that arrive between two polls share the later time."""
    path, start = tmp_path / "metrics.jsonl", 1000.0
    watch = bench.RowWatch(path)
    watch.poll(start)  # no file yet
    assert watch.ends == []
    path.write_text('{"rollout_id": 0}\n')
    os.utime(path, ns=(0, 1_001_500_000_000))
    watch.poll(start)
    watch.poll(start)  # unchanged: nothing new
    path.write_text(path.read_text() + '{"rollout_id": 1}\n{"rollout_id": 2}\n')
    os.utime(path, ns=(0, 1_003_250_000_000))
    watch.poll(start)
    assert watch.ends == pytest.approx([1.5, 3.25, 3.25])


def test_repeated_rounds_report_the_median_of_each_figure():
    """`--repeat`: each ratio is taken within its round, then the median over the rounds."""
    assert bench.parse_args(["--repeat", "3"]).repeat == 3
    with pytest.raises(SystemExit):
        bench.parse_args(["--repeat", "0"])
    rounds = [{"ours": {"step": s, "step_median": m, "startup": u}, "trl": {"step": 1.0, "step_median": 0.5, "startup": 6.0},
               "ratio_step": s, "ratio_step_median": m / 0.5, "ratio_startup": u / 6.0, "load_before": [0.1] * 3}
              for s, m, u in ((0.9, 0.4, 13.0), (1.5, 0.6, 18.0), (1.0, 0.45, 14.0))]
    medians = bench.median_of_rounds(rounds)
    assert medians["ours step"] == pytest.approx(1.0) and medians["ratio median intervals"] == pytest.approx(0.9)
    assert medians["ours start-up"] == pytest.approx(14.0) and medians["ratio start-up"] == pytest.approx(14.0 / 6.0)
    text = bench.render_rounds(rounds, medians)
    assert "round 2: per step 1.50 (median intervals 1.20)  start-up ours 18.0 s" in text
    assert "median of 3 rounds: ours step 1.00 s" in text and "ratio median intervals 0.90" in text
