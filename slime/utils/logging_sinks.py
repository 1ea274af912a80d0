"""Metric sinks: every metric dict goes to a JSONL file, and to wandb / tensorboard when asked.

Metrics are flat `dict[str, float]` with namespaced keys (`rollout/`, `train/`, `eval/`, `perf/`)
and one `step` (the rollout id). wandb and tensorboard are imported only here and only when their
flag is set; a missing package fails at start-up with an install hint. The wandb key comes from
`$WANDB_API_KEY` (wandb reads it itself) or, for slime compatibility, `--wandb-key` (handed to
`wandb.init` in its settings, which never writes it to ~/.netrc, unlike `wandb.login`); it is
never logged or printed.
"""

from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path

from slime.utils.run_folder import DEFAULT_METRICS_DIR

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SinkConfig:
    """What the sinks need from the arguments (logging domain)."""

    metrics_dir: str | None = None
    use_wandb: bool = False
    wandb_mode: str | None = None
    wandb_project: str | None = None
    wandb_group: str | None = None
    wandb_team: str | None = None
    wandb_host: str | None = None
    wandb_key: str | None = None
    wandb_dir: str | None = None
    use_tensorboard: bool = False
    tb_project_name: str | None = None
    tb_experiment_name: str | None = None

    @classmethod
    def from_args(cls, args) -> "SinkConfig":
        return cls(**{f: getattr(args, f, None) for f in cls.__dataclass_fields__})

    def __repr__(self) -> str:  # never show the key
        shown = {k: v for k, v in self.__dict__.items() if k != "wandb_key"}
        return f"SinkConfig({shown}, wandb_key={'<set>' if self.wandb_key else None})"


def _clean(metrics: dict) -> dict[str, float]:
    out = {}
    for key, value in metrics.items():
        value = float(value.item() if hasattr(value, "item") else value)
        out[key] = value if math.isfinite(value) else None
    return out


class JsonlSink:
    """Appends one JSON object per `log` call: {"rollout_id": step, **metrics}, flushed to disk
    before `log` returns.

    The file is never truncated: a resumed run appends to it. When the run starts at rollout
    `start` and the file already has rows from `start` on (the previous run went past its last
    checkpoint), those rows stay and the new ones follow; readers keep the last row of a rollout
    id (`tools/plot_metrics.py` does)."""

    def __init__(self, path: Path, start: int = 0):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        replaced = _rows_from(self.path, start)
        if replaced:
            logger.warning("%s: %d row(s) from rollout %d on were written by an earlier run; the resumed run's "
                           "rows follow them (the last row of a rollout id is the current one)",
                           self.path, replaced, start)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps({"rollout_id": step, **metrics}, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def close(self) -> None:
        pass


def _rows_from(path: Path, start: int) -> int:
    """Rows of the metrics file at `path` with rollout_id >= `start` (streamed; bad lines skipped)."""
    if not path.is_file():
        return 0
    count = 0
    with path.open() as f:
        for line in f:
            try:
                count += json.loads(line).get("rollout_id", 0) >= start
            except (json.JSONDecodeError, AttributeError):
                continue
    return count


class ConsoleSink:
    """One progress line per logged row: reward, eval, KL, entropy and step time."""

    FIELDS = (
        ("reward", "rollout/raw_reward"),
        ("ppo_kl", "train/ppo_kl"),
        ("kl_loss", "train/kl_loss"),
        ("entropy", "train/entropy_loss"),
        ("grad_norm", "train/grad_norm"),
    )

    def __init__(self, total: int | None = None):
        self.total = total
        self.last = None

    def log(self, step: int, metrics: dict[str, float]) -> None:
        parts = [f"rollout {step}" + (f"/{self.total}" if self.total else "")]
        parts += [f"{name} {metrics[key]:.4g}" for name, key in self.FIELDS if metrics.get(key) is not None]
        parts += [f"{k} {v:.4g}" for k, v in sorted(metrics.items()) if k.startswith("eval/") and v is not None
                  and k.count("/") == 1]
        seconds = sum(v for k, v in metrics.items() if k.endswith("_time") and k.startswith("perf/") and v)
        if seconds:
            parts.append(f"step {seconds:.1f}s")
        logger.info(" | ".join(parts))

    def close(self) -> None:
        pass


def _require(module: str, flag: str, package: str):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise RuntimeError(f"{flag} needs the '{package}' package: pip install {package}  (or pip install -e .[logging])") from e


class WandbSink:
    """Logs to wandb; `--wandb-mode offline` works without network. `--wandb-team` is the run's
    entity, `--wandb-host` the server (wandb's `base_url`); neither the key nor the host is written to
    disk (no `wandb.login`)."""

    def __init__(self, cfg: SinkConfig):
        wandb = self.wandb = _require("wandb", "--use-wandb", "wandb")
        # the key and the server go in this run's settings, for this process only: no wandb.login,
        # which would write the key to ~/.netrc
        overrides = {k: v for k, v in (("api_key", cfg.wandb_key), ("base_url", cfg.wandb_host)) if v}
        settings = wandb.Settings(**overrides) if overrides else None
        self.run = wandb.init(
            project=cfg.wandb_project or "slime",
            entity=cfg.wandb_team,
            group=cfg.wandb_group,
            mode=cfg.wandb_mode or "online",
            dir=cfg.wandb_dir,
            settings=settings,
        )

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log({k: v for k, v in metrics.items() if v is not None}, step=step)

    def close(self) -> None:
        """Finish the run and stop wandb's service process now (not at interpreter exit, after
        the job has stopped every process it started)."""
        self.run.finish()
        self.wandb.teardown()


class TensorboardSink:
    """Writes scalars under `$TENSORBOARD_DIR` or `<metrics dir>/tensorboard/<project>/<experiment>`."""

    def __init__(self, cfg: SinkConfig, root: Path):
        tb = _require("torch.utils.tensorboard", "--use-tensorboard", "tensorboard")
        logdir = Path(os.environ.get("TENSORBOARD_DIR", root / "tensorboard"))
        logdir = logdir / (cfg.tb_project_name or "slime") / (cfg.tb_experiment_name or "run")
        self.writer = tb.SummaryWriter(log_dir=str(logdir))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            if value is not None:
                self.writer.add_scalar(key, value, global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class MetricsLogger:
    """Fans one metrics dict out to every configured sink. JSONL is always on.

    `begin(step, metrics)` names the dict the loop fills for rollout `step`; if the job fails
    before `log(step, ...)` writes it, `close()` writes what it holds, so the metrics of the
    rollout that was running when something failed (a save, a weight sync) are not lost."""

    def __init__(self, cfg: SinkConfig, default_dir: str | Path = DEFAULT_METRICS_DIR, total: int | None = None,
                 start: int = 0):
        root = Path(cfg.metrics_dir or default_dir)
        self.jsonl_path = root / "metrics.jsonl"
        self.sinks = [JsonlSink(self.jsonl_path, start), ConsoleSink(total)]
        if cfg.use_wandb:
            self.sinks.append(WandbSink(cfg))
        if cfg.use_tensorboard:
            self.sinks.append(TensorboardSink(cfg, root))
        self._pending: tuple[int, dict] | None = None
        logger.info("metrics go to %s (%s)", self.jsonl_path, ", ".join(type(s).__name__ for s in self.sinks))

    def begin(self, step: int, metrics: dict) -> None:
        """Rollout `step`'s row is `metrics` (filled in place by the loop) until `log(step, ...)`."""
        self._pending = (step, metrics)

    def log(self, step: int, metrics: dict) -> None:
        if self._pending is not None and self._pending[0] == step:
            self._pending = None
        clean = _clean(metrics)
        for sink in self.sinks:
            sink.log(step, clean)

    def close(self) -> None:
        """Write a row begun and not logged (the job failed within its rollout), then close the sinks."""
        if self._pending is not None and self._pending[1]:
            step, metrics = self._pending
            logger.warning("writing the metrics of rollout %d, which did not finish", step)
            self.log(step, metrics)
        for sink in self.sinks:
            sink.close()
