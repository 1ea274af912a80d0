"""Metric sinks: JSONL content, non-finite values, the secret key (sinks, wandb offline, train.py
--dry-run output), missing optional packages, tensorboard events."""

import importlib.util
import json
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from slime.utils.logging_sinks import MetricsLogger, SinkConfig


def test_jsonl_one_object_per_rollout(tmp_path):
    log = MetricsLogger(SinkConfig(metrics_dir=str(tmp_path)))
    log.log(0, {"rollout/raw_reward": 0.25, "train/loss": torch.tensor(1.5)})
    log.log(1, {"rollout/raw_reward": 0.75, "train/grad_norm": float("nan")})
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows == [
        {"rollout_id": 0, "rollout/raw_reward": 0.25, "train/loss": 1.5},
        {"rollout_id": 1, "rollout/raw_reward": 0.75, "train/grad_norm": None},
    ]


def test_config_from_args_hides_key():
    args = SimpleNamespace(use_wandb=True, wandb_key="very-secret", wandb_project="p")
    cfg = SinkConfig.from_args(args)
    assert cfg.wandb_project == "p" and cfg.wandb_key == "very-secret"
    assert "very-secret" not in repr(cfg)


@pytest.mark.skipif(importlib.util.find_spec("wandb") is not None, reason="wandb installed")
def test_missing_wandb_fails_with_install_hint(tmp_path):
    with pytest.raises(RuntimeError, match="--use-wandb needs the 'wandb' package: pip install wandb"):
        MetricsLogger(SinkConfig(metrics_dir=str(tmp_path), use_wandb=True))


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None, reason="tensorboard not installed")
def test_tensorboard_writes_events(tmp_path, monkeypatch):
    monkeypatch.delenv("TENSORBOARD_DIR", raising=False)
    log = MetricsLogger(SinkConfig(metrics_dir=str(tmp_path), use_tensorboard=True, tb_project_name="p"))
    log.log(3, {"train/loss": 0.5})
    log.close()
    assert list((tmp_path / "tensorboard" / "p" / "run").glob("events.out.tfevents.*"))


def test_console_line_has_reward_eval_kl_entropy_and_time(tmp_path, caplog):
    import logging

    log = MetricsLogger(SinkConfig(metrics_dir=str(tmp_path)), total=10)
    with caplog.at_level(logging.INFO, logger="slime.utils.logging_sinks"):
        log.log(3, {"rollout/raw_reward": 0.5, "eval/toy": 0.25, "train/ppo_kl": 0.001,
                    "train/entropy_loss": 2.5, "perf/rollout_time": 1.5, "perf/train_time": 2.0})
    line = caplog.records[-1].getMessage()
    assert line == "rollout 3/10 | reward 0.5 | ppo_kl 0.001 | entropy 2.5 | eval/toy 0.25 | step 3.5s"


@pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="wandb not installed")
def test_wandb_offline_writes_a_run_without_the_key(tmp_path, monkeypatch, capfd):
    for var in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_DIR"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # ~/.netrc must stay unwritten
    secret = "wandb-key-never-shown-123"
    cfg = SinkConfig(metrics_dir=str(tmp_path / "m"), use_wandb=True, wandb_mode="offline", wandb_key=secret,
                     wandb_project="p", wandb_dir=str(tmp_path))
    log = MetricsLogger(cfg)
    log.log(0, {"train/loss": 0.5, "perf/train_time": 1.0, "train/grad_norm": float("nan")})
    log.close()
    (run,) = (tmp_path / "wandb").glob("offline-run-*")
    assert list(run.glob("run-*.wandb")), "no wandb event file in the offline run"
    out, err = capfd.readouterr()
    assert secret not in out + err
    for path in [p for p in tmp_path.rglob("*") if p.is_file()]:
        assert secret.encode() not in path.read_bytes(), path


@pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="wandb not installed")
def test_online_wandb_gets_the_key_in_its_run_settings_not_by_login(monkeypatch):
    import wandb

    from slime.utils.logging_sinks import WandbSink

    def login(*_args, **_kwargs):
        raise AssertionError("wandb.login(key=...) writes the key to ~/.netrc")

    seen = {}
    monkeypatch.setattr(wandb, "login", login)
    monkeypatch.setattr(wandb, "init", lambda **kwargs: seen.update(kwargs))
    WandbSink(SinkConfig(use_wandb=True, wandb_mode="online", wandb_key="k-123"))
    assert seen["mode"] == "online" and seen["settings"].api_key == "k-123"


def test_dry_run_output_has_no_wandb_key(tmp_path):
    from pathlib import Path

    from tests.e2e.runner import REPO_ROOT, grpo_argv, subprocess_env

    secret = "dry-run-SECRET-key-987"
    missing = tmp_path / "missing"
    argv = grpo_argv(missing / "hf", missing / "ref", missing / "data", tmp_path, num_rollout=2)
    proc = subprocess.run([sys.executable, "train.py", *argv, "--dry-run", "--use-wandb", "--wandb-key", secret],
                          cwd=REPO_ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "== Placement" in proc.stdout  # the plan was printed ...
    assert secret not in proc.stdout + proc.stderr  # ... without the key
    assert not any(secret in p.read_text(errors="replace") for p in Path(tmp_path).rglob("*") if p.is_file())


def test_jsonl_is_appended_on_resume_and_never_truncated(tmp_path):
    path = tmp_path / "metrics.jsonl"
    first = MetricsLogger(SinkConfig(metrics_dir=str(tmp_path)))
    for step in range(4):
        first.log(step, {"rollout/raw_reward": float(step)})
    resumed = MetricsLogger(SinkConfig(metrics_dir=str(tmp_path)), start=2)  # resume after rollout 1
    resumed.log(2, {"rollout/raw_reward": 20.0})
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    assert [r["rollout/raw_reward"] for r in rows] == [0.0, 1.0, 2.0, 3.0, 20.0]
    MetricsLogger(SinkConfig(metrics_dir=str(tmp_path)))  # a new logger never empties the file
    assert len(path.read_text().splitlines()) == 5


def test_row_begun_and_not_logged_is_written_on_close(tmp_path):
    """The job fails after rollout 1 was generated and trained (e.g. its save): the row is kept."""
    log = MetricsLogger(SinkConfig(metrics_dir=str(tmp_path)))
    row = {"rollout/raw_reward": 0.5}
    log.begin(0, row)
    log.log(0, row)
    row = {"rollout/raw_reward": 0.7}
    log.begin(1, row)
    row |= {"train/loss": 0.1}  # the loop fills the same dict
    log.close()
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["rollout_id"], r.get("train/loss")) for r in rows] == [(0, None), (1, 0.1)]


class _FakeWandb:
    """Records the calls WandbSink makes (handed in through `_require`, no sys.modules stub)."""

    def __init__(self):
        self.calls = []

    def login(self, **kw):
        self.calls.append(("login", kw))

    @staticmethod
    def Settings(**kw):  # noqa: N802 (wandb's name)
        return SimpleNamespace(**kw)

    def init(self, **kw):
        self.calls.append(("init", kw))
        return SimpleNamespace(log=lambda *a, **k: None, finish=lambda: None)

    def teardown(self):
        pass


@pytest.mark.parametrize("key", [None, "k"])
def test_wandb_team_is_the_entity_and_host_the_server(monkeypatch, tmp_path, key):
    fake = _FakeWandb()
    monkeypatch.setattr("slime.utils.logging_sinks._require", lambda *a: fake)
    args = SimpleNamespace(use_wandb=True, wandb_mode="online", wandb_team="my-team",
                           wandb_host="https://wandb.example.org", wandb_key=key, metrics_dir=str(tmp_path))
    MetricsLogger(SinkConfig.from_args(args)).close()
    assert [name for name, _ in fake.calls] == ["init"]  # no wandb.login: nothing written to ~/.netrc
    init = fake.calls[0][1]
    assert init["entity"] == "my-team" and init["settings"].base_url == "https://wandb.example.org"
    assert getattr(init["settings"], "api_key", None) == key
