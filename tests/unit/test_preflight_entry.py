"""train.py's main before Ray starts: every pre-flight finding is one line naming the flag and the
file (and line), exit 2; a run folder in use or holding another run is refused; a failed job is
one line with its root cause. `loop` is a stand-in for the training loop, so no Ray starts."""

import json
import os
import subprocess
import sys

import pytest

import train
from tests.e2e.runner import grpo_argv

ROWS = [{"prompt": f"{n} mod 2", "label": str(n % 2)} for n in range(4)]


def _write_rows(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def _fake_checkpoint(folder):
    """A folder that reads as a complete torch_dist checkpoint (tracker, iteration, its markers)."""
    from slime.utils.checkpoint_layout import COMPLETE_MARKERS, TRACKER_FILE

    iteration = folder / "iter_0000000"
    iteration.mkdir(parents=True, exist_ok=True)
    for name in COMPLETE_MARKERS:
        (iteration / name).write_text("{}")
    (folder / TRACKER_FILE).write_text("0\n")


@pytest.fixture
def job(tmp_path, tiny_moe_hf):
    """argv(extra) of a valid CPU GRPO job in tmp_path, and the list of loops run."""
    data = tmp_path / "data"
    data.mkdir()
    _write_rows(data / "train.jsonl", ROWS)
    _fake_checkpoint(tmp_path / "ref")

    def argv(*extra, hf=tiny_moe_hf):
        return grpo_argv(hf, tmp_path / "ref", data, tmp_path / "run", num_rollout=2, extra=list(extra))

    return argv


def _run(argv, capsys):
    """(exit code, stderr lines, loops run) of main(argv) with a stand-in loop."""
    ran = []
    code = train.main(argv, loop=ran.append)
    return code, capsys.readouterr().err.strip().splitlines(), ran


def _one_line(code, err, *needles):
    assert code == 2, err
    assert len(err) == 1 and err[0].startswith("train.py: error: "), err
    assert all(n in err[0] for n in needles), (err, needles)


def test_valid_job_reaches_the_loop(job, capsys):
    code, err, ran = _run(job(), capsys)
    assert code == 0 and len(ran) == 1, err


@pytest.mark.parametrize("bad, needles", [
    (ROWS[:2] + ['{"prompt": "x", '], ["--prompt-data", "train.jsonl:3:", "not valid JSON"]),
    ([ROWS[0], {"question": "x", "label": "1"}], ["--prompt-data", "train.jsonl:2:", "'prompt'", "--input-key"]),
    ([ROWS[0], ROWS[1], {"prompt": "x"}], ["--prompt-data", "train.jsonl:3:", "'label'", "--label-key"]),
    ([ROWS[0], {"prompt": "x", "label": "1", "metadata": 3}], ["train.jsonl:2:", "--metadata-key"]),
    (["", "  "], ["--prompt-data", "no rows"]),
])
def test_bad_prompt_file_one_line_with_line_number(job, tmp_path, capsys, bad, needles):
    _write_rows(tmp_path / "data" / "train.jsonl", bad)
    _one_line(*_run(job(), capsys)[:2], *needles)


def test_bad_eval_file_named_by_dataset(job, tmp_path, capsys):
    _write_rows(tmp_path / "data" / "eval.jsonl", [ROWS[0], ROWS[1], "[1, 2]"])
    code, err, _ = _run(job("--eval-prompt-data", "toy", str(tmp_path / "data" / "eval.jsonl")), capsys)
    _one_line(code, err, "--eval-prompt-data toy", "eval.jsonl:3:", "JSON object")


def test_dry_run_warns_on_missing_paths_but_refuses_broken_files(job, tmp_path, capsys):
    argv = job("--dry-run")
    argv[argv.index("--prompt-data") + 1] = str(tmp_path / "elsewhere" / "train.jsonl")
    assert train.main(argv) == 0  # a recipe dry-run away from its cluster stays clean
    _write_rows(tmp_path / "data" / "train.jsonl", ['{"prompt": 1'])
    code, err, _ = _run(job("--dry-run"), capsys)
    _one_line(code, err, "train.jsonl:1:")


def test_missing_chat_template(job, tmp_path, tiny_moe_hf, capsys):
    hf = tmp_path / "hf"
    hf.mkdir()
    for f in tiny_moe_hf.iterdir():
        if f.is_file() and not f.name.startswith("chat_template"):
            (hf / f.name).symlink_to(f)
    config = json.loads((tiny_moe_hf / "tokenizer_config.json").read_text())
    (hf / "tokenizer_config.json").unlink()
    (hf / "tokenizer_config.json").write_text(json.dumps({k: v for k, v in config.items() if k != "chat_template"}))
    _one_line(*_run(job(hf=hf), capsys)[:2], "--apply-chat-template", str(hf), "no chat template")


def test_plugin_that_does_not_import_or_does_not_fit(job, tmp_path, capsys, monkeypatch):
    _one_line(*_run(job("--custom-rm-path", "no_such_module.rm"), capsys)[:2],
              "--custom-rm-path no_such_module.rm", "cannot be imported")
    (tmp_path / "my_rm.py").write_text("async def rm(args):\n    return 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    _one_line(*_run(job("--custom-rm-path", "my_rm.rm"), capsys)[:2],
              "--custom-rm-path my_rm.rm(args)", "async rm(args, sample)")


def test_checkpoint_header_that_does_not_read(job, tmp_path, capsys):
    (tmp_path / "ref" / "latest_checkpointed_iteration.txt").write_text("twenty\n")
    _one_line(*_run(job(), capsys)[:2], "--ref-load", "latest_checkpointed_iteration.txt", "'twenty")
    (tmp_path / "ref" / "latest_checkpointed_iteration.txt").write_text("20\n")
    _one_line(*_run(job(), capsys)[:2], "--ref-load", "iter_0000020")


def test_save_that_cannot_be_written(job, tmp_path, capsys):
    (tmp_path / "a_file").write_text("")
    _one_line(*_run(job("--save", str(tmp_path / "a_file" / "ckpt")), capsys)[:2],
              "--save", "a_file/ckpt", "cannot write")


@pytest.mark.parametrize("flags, needles", [
    (["--lr", "-1"], ["--lr -1.0 must be >= 0"]),
    (["--eps-clip", "2"], ["--eps-clip 2.0 must be in (0, 1]"]),
    (["--rollout-top-p", "0"], ["--rollout-top-p"]),
])
def test_numbers_that_can_only_be_mistakes(job, capsys, flags, needles):
    _one_line(*_run(job(*flags), capsys)[:2], *needles)


def test_argparse_error_is_one_line_without_usage(job, capsys):
    code, err, _ = _run(job("--lr", "abc"), capsys)
    _one_line(code, err, "--lr", "invalid float value", "--help")
    assert "usage" not in err[0]


HOLD = """
import sys
from pathlib import Path
from slime.utils.run_folder import RunLock
lock = RunLock([("--metrics-dir", Path(sys.argv[1]))], command=["train.py", "first"]).acquire()
print("locked", flush=True)
sys.stdin.readline()
"""


def test_concurrent_launch_refused_at_once(job, tmp_path, capsys):
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path / "run" / "metrics")], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        assert holder.stdout.readline().strip() == "locked"
        code, err, ran = _run(job(), capsys)
        _one_line(code, err, f"--metrics-dir {tmp_path / 'run' / 'metrics'}", f"PID {holder.pid}", "train.py first")
        assert not ran
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)


def test_rerun_refused_or_resumed_and_nothing_lost(job, tmp_path, capsys):
    metrics = tmp_path / "run" / "metrics" / "metrics.jsonl"
    metrics.parent.mkdir(parents=True)
    before = '{"rollout_id": 0, "rollout/raw_reward": 0.5}\n'
    metrics.write_text(before)
    code, err, ran = _run(job(), capsys)
    _one_line(code, err, "--metrics-dir", "1 rows in metrics.jsonl", "--overwrite-run", "--load")
    assert not ran and metrics.read_text() == before
    ckpt = tmp_path / "run" / "ckpt"
    ckpt.mkdir(exist_ok=True)  # the refused launch created it to lock it
    _fake_checkpoint(ckpt)
    _fake_checkpoint(tmp_path / "elsewhere")
    code, err, ran = _run(job("--load", str(tmp_path / "elsewhere")), capsys)
    _one_line(code, err, f"--save {ckpt}", "already holds a checkpoint", f"--load {ckpt}")
    code, err, ran = _run(job("--load", str(ckpt)), capsys)  # the resume
    assert code == 0 and ran and metrics.read_text() == before, err
    code, err, ran = _run(job("--overwrite-run"), capsys)
    assert code == 0 and ran and not metrics.exists()
    assert [p.read_text() for p in metrics.parent.glob("metrics.jsonl.replaced-*")] == [before]


def test_failed_job_is_one_line_with_its_root_cause(job, tmp_path, capsys, caplog):
    def loop(args):
        try:
            open(tmp_path / "no_such_file.txt")
        except OSError as e:
            raise RuntimeError("rollout manager failed") from e

    assert train.main(job(), loop=loop) == 1
    failed = [r.getMessage() for r in caplog.records if r.getMessage().startswith("job failed")]
    assert len(failed) == 1 and failed[0].startswith("job failed: FileNotFoundError:") and "no_such_file.txt" in failed[0]
    assert "Traceback" in (tmp_path / "run" / "metrics" / "error.log").read_text()
    with pytest.raises(RuntimeError):
        train.main(job("--traceback"), loop=loop)


def test_eval_config_that_is_not_yaml(job, tmp_path, capsys):
    (tmp_path / "eval.yaml").write_text("datasets: [\n  - name: x\n")
    _one_line(*_run(job("--eval-config", str(tmp_path / "eval.yaml")), capsys)[:2], "--eval-config", "not valid YAML")


def test_megatron_core_refusal_at_start_up_is_one_line(job, capsys):
    """The machine's and megatron-core's checks run in a thread (megatron_utils.startup_checks): a
    refusal there is one line naming the flag, exit 2, and the loop never runs."""
    code, err, ran = _run(job("--moe-permute-fusion"), capsys)
    _one_line(code, err, "--moe-permute-fusion", "Transformer Engine")
    assert ran == []
