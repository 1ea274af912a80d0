"""Benchmark: our main job against TRL's GRPOTrainer, per step and start-up, in one invocation.

Usage: `python tools/bench_vs_trl.py [--short 10] [--long 30] [--repeat 1] [--work-dir DIR]
[--trl-venv DIR] [--install-trl] [--output bench_vs_trl.json] [-- extra train.py flags]`.

Both train the tiny Qwen3-MoE (tools/make_tiny_model.py, seed 0) on the parity data
(tools/make_toy_data.py, seed 0) with 32 prompts x 8 one-token samples per step at temperature 1,
lr 2e-3, one optimizer step per batch:

- ours: `python train.py` with the flags of `scripts/run-tiny-moe-cpu.sh` minus eval and
  checkpoints (`tools/bench_loop.py`'s LOOP_FLAGS: Ray, 2 gloo trainer ranks with EP2, one local
  engine), `--metrics-dir` in the work folder;
- TRL: `tools/trl_grpo_peer.py` (GRPOTrainer, no KL term, see its docstring) in a throw-away venv
  that holds TRL (`--trl-venv`, default ~/.cache/slime/trl-venv; `--install-trl` creates it:
  torch 2.13.0 first, so no CUDA build is pulled, then trl). TRL is never a dependency of slime.

Each runs as a command of its own twice, `--short` and `--long` steps (TRL short, ours short,
TRL long, ours long, so both see about the same load). Per step = (wall time of the long command -
wall time of the short one) / (long - short): start-up and shutdown are the same in both commands
and cancel. Start-up = command start -> end of the first step, minus one step (the median
interval below; ours: the first row of metrics.jsonl appearing; TRL: its first `on_step_end`). Also printed: the median interval
between consecutive step ends of the long command (after its first two steps), a per-step figure
less exposed to one slow start-up on a busy machine. Prints both, the ratios ours / TRL,
the machine's load average and our short run's start-up profile (`slime.utils.startup_profile`:
each stage's end in seconds since the command started), and writes them as JSON. Absolute times on a shared machine are noise;
compare within one run. `--repeat N` runs the four commands N times in a row and also prints the
median over the rounds of every figure and ratio (each ratio taken within its round): on a machine
whose speed drifts, one round's start-up can move by seconds. The work stays under the `__main__`
guard.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_VENV = Path.home() / ".cache" / "slime" / "trl-venv"
TORCH_PIN = "torch==2.13.0"  # the CPU build the project's venv installs first (scripts/lib/venv.sh)
RUN_TIMEOUT_S = 1800
START_ENV, PROFILE_ENV = "SLIME_START_TIME", "SLIME_STARTUP_PROFILE"  # slime.utils.startup_profile's
logger = logging.getLogger("bench_vs_trl")


def parse_args(argv=None) -> argparse.Namespace:
    """Benchmark flags; anything after `--` is appended to train.py's flags."""
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--short", type=int, default=10, help="steps of the short command of each")
    parser.add_argument("--long", type=int, default=30, help="steps of the long command of each")
    parser.add_argument("--work-dir", default="/tmp/bench_vs_trl", help="model, data, torch_dist and run folders (reused)")
    parser.add_argument("--trl-venv", default=str(DEFAULT_VENV), help="venv holding trl (see --install-trl)")
    parser.add_argument("--install-trl", action="store_true", help="create --trl-venv if it holds no trl")
    parser.add_argument("--repeat", type=int, default=1,
                        help="rounds of the four commands; with more than one, the medians over rounds are printed too")
    parser.add_argument("--output", default="bench_vs_trl.json", help="JSON result file")
    opts = parser.parse_args(argv)
    if not 1 <= opts.short < opts.long:
        parser.error(f"--short {opts.short} / --long {opts.long}: need 1 <= --short < --long")
    if opts.repeat < 1:
        parser.error(f"--repeat {opts.repeat}: need at least one round")
    opts.extra = extra
    return opts


def _load_tool(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_vs_trl_{name}", REPO / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def trl_python(venv: Path, install: bool) -> Path:
    """The venv's python, after checking it imports trl (creating the venv with `install`)."""
    python = venv / "bin" / "python"
    if python.exists() and subprocess.run([str(python), "-c", "import trl"], capture_output=True).returncode == 0:
        return python
    if not install:
        raise SystemExit(f"--trl-venv {venv}: no python with trl there; pass --install-trl to create it")
    logger.warning("creating %s (%s first, then trl)", venv, TORCH_PIN)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    for package in (TORCH_PIN, "trl"):
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", package], check=True)
    return python


class RowWatch:
    """When each row of a growing file was written: a change of the file's size (polled) dates its
    new rows by the file's modification time, so a step's end is as precise as the file system's
    clock whatever the polling interval (as long as one interval sees at most one new row)."""

    def __init__(self, path: Path) -> None:
        self.path, self.size, self.ends = path, 0, []

    def poll(self, start: float) -> None:
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            return
        if stat.st_size != self.size:
            self.size = stat.st_size
            rows = self.path.read_bytes().count(b"\n")
            self.ends += [stat.st_mtime_ns / 1e9 - start] * (rows - len(self.ends))


def _run(cmd: list[str], log: Path, rows: RowWatch | None = None, env: dict | None = None) -> dict:
    """Run `cmd` (output to `log`, `env` added to the environment); returns its wall seconds and,
    with `rows` (one row per step, polled every 5 ms), the seconds from the start at which each
    step's row was written ("step_ends")."""
    start = time.time()
    env = {**os.environ, **(env or {}), START_ENV: repr(start)}
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=env)
        while proc.poll() is None:
            if rows is not None:
                rows.poll(start)
            if time.time() - start > RUN_TIMEOUT_S:
                proc.kill()
                raise SystemExit(f"{cmd[1]} ran past {RUN_TIMEOUT_S} s; see {log}")
            time.sleep(0.005)
    wall = time.time() - start
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd[:2])} failed (exit code {proc.returncode}); see {log}")
    if rows is not None:
        rows.poll(start)
    return {"wall": wall, "step_ends": rows.ends if rows is not None else [], "started_at": start}


# The peer runs with beta=0: TRL builds no reference model and computes no KL. The main job's
# `--use-kl-loss --kl-loss-coef 0.0` (slime's recipes) runs a reference forward pass per rollout
# for its `train/kl_loss` metric; ours leaves those flags out here, so that both do the same work.
KL_FLAGS = {"--use-kl-loss": 0, "--kl-loss-coef": 1, "--kl-loss-type": 1}  # flag -> values it takes
# The peer trains on the whole batch in one forward and backward (per_device_train_batch_size =
# 256, no gradient accumulation). The main job's `--max-tokens-per-gpu 2048` splits a rank's half
# (128 samples of about 20 tokens) into two micro-batches; this budget holds it in one, as TRL.
ONE_PASS_TOKENS = "8192"


def same_work_as_trl(flags: list[str]) -> list[str]:
    """`flags` without KL_FLAGS (and their values), with `--max-tokens-per-gpu ONE_PASS_TOKENS`."""
    out, skip = [], 0
    for flag in flags:
        if skip:
            skip -= 1
        elif flag in KL_FLAGS:
            skip = KL_FLAGS[flag]
        else:
            out.append(ONE_PASS_TOKENS if out[-1:] == ["--max-tokens-per-gpu"] else flag)
    return out


def run_ours(work: Path, hf: Path, train: Path, dist: Path, steps: int, extra: list[str]) -> dict:
    """train.py with the job's flags minus eval and checkpoints, `steps` rollouts, fresh metrics."""
    loop = _load_tool("bench_loop")
    run_dir = work / f"ours-{steps}"
    run_dir.mkdir(parents=True, exist_ok=True)
    metrics, profile = run_dir / "metrics.jsonl", run_dir / "startup_profile.jsonl"
    metrics.unlink(missing_ok=True)
    profile.unlink(missing_ok=True)
    cmd = [sys.executable, "train.py", *loop.model_flags(hf), *same_work_as_trl(loop.LOOP_FLAGS), "--hf-checkpoint", str(hf),
           "--ref-load", str(dist), "--prompt-data", str(train), "--num-rollout", str(steps),
           "--metrics-dir", str(run_dir), *extra]
    # one metrics row per rollout (no eval: no extra final row)
    out = _run(cmd, run_dir / "train.log", rows=RowWatch(metrics), env={PROFILE_ENV: str(profile)})
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    out["rewards"] = [r.get("rollout/raw_reward") for r in rows]
    marks = [json.loads(line) for line in profile.read_text().splitlines()] if profile.exists() else []
    out["profile"] = sorted(marks, key=lambda row: row["t"])
    return out


def run_trl(python: Path, work: Path, hf: Path, train: Path, steps: int) -> dict:
    """tools/trl_grpo_peer.py for `steps` steps in the TRL venv."""
    result = work / f"trl-{steps}.json"
    result.unlink(missing_ok=True)
    cmd = [str(python), str(REPO / "tools" / "trl_grpo_peer.py"), "--model", str(hf), "--data", str(train),
           "--steps", str(steps), "--output", str(result), "--started-at", repr(time.time())]
    out = _run(cmd, work / f"trl-{steps}.log")
    peer = json.loads(result.read_text())
    out["step_ends"] = [t - out["started_at"] for t in peer["step_ends"]]
    out["rewards"] = peer["rewards"]
    return out


def summarize(runs: dict, short: int, long: int) -> dict:
    """Per step, start-up and the ratios ours / TRL from the four commands; also the median
    interval between step ends of the long command after its first two steps ("step_median")."""
    result: dict = {"short": short, "long": long}
    for name in ("ours", "trl"):
        a, b = runs[f"{name}-{short}"], runs[f"{name}-{long}"]
        step = (b["wall"] - a["wall"]) / (long - short)
        first = a["step_ends"][0]
        intervals = [y - x for x, y in zip(b["step_ends"][1:], b["step_ends"][2:])]
        median = statistics.median(intervals) if intervals else None
        one_step = median if median is not None else step  # the median does not move with start-up
        result[name] = {"step": step, "startup": first - one_step, "first_step": first, "step_median": median,
                        "wall_short": a["wall"], "wall_long": b["wall"], "fixed": a["wall"] - short * step}
    result["ratio_step"] = result["ours"]["step"] / result["trl"]["step"]
    if result["trl"]["step_median"] and result["ours"]["step_median"] is not None:
        result["ratio_step_median"] = result["ours"]["step_median"] / result["trl"]["step_median"]
    result["ratio_startup"] = result["ours"]["startup"] / result["trl"]["startup"]
    result["rewards"] = {k: v["rewards"] for k, v in runs.items()}
    result["profile"] = runs[f"ours-{short}"].get("profile", [])
    return result


def render(result: dict) -> str:
    lines = [f"per step = (wall of {result['long']} steps - wall of {result['short']}) / {result['long'] - result['short']}; "
             "start-up = command -> end of first step, minus one step (the median interval); "
             "fixed = wall of the short run - its steps"]
    for name in ("ours", "trl"):
        r = result[name]
        median = "n/a" if r["step_median"] is None else f"{r['step_median']:.3f}"
        lines.append(f"{name:<5} step {r['step']:.3f} s (median interval {median} s)  start-up {r['startup']:.1f} s  first step done {r['first_step']:.1f} s"
                     f"  fixed {r['fixed']:.1f} s  walls {r['wall_short']:.1f} / {r['wall_long']:.1f} s")
    lines.append(f"our start-up profile ({result['short']}-step run; seconds since the command started):")
    lines += [f"  {row['t']:7.2f}  {row['event']}" for row in result.get("profile", [])]
    lines.append(f"ratio ours/TRL: per step {result['ratio_step']:.2f} (median intervals "
                 f"{result.get('ratio_step_median', float('nan')):.2f})  start-up {result['ratio_startup']:.2f}")
    if min(result["ours"]["step"], result["trl"]["step"]) <= 0:
        lines.append("warning: a long command finished no later than its short one (the load moved during the run): "
                     "the per-step figures by difference are meaningless here; read the median intervals")
    lines.append(f"load average before / after: {result['load_before']} / {result['load_after']}")
    return "\n".join(lines)


# (label, path into a round's summary) of each figure the median over rounds reports
ROUND_FIGURES = (("ours step", ("ours", "step")), ("TRL step", ("trl", "step")),
                 ("ours median interval", ("ours", "step_median")), ("TRL median interval", ("trl", "step_median")),
                 ("ours start-up", ("ours", "startup")), ("TRL start-up", ("trl", "startup")),
                 ("ratio per step", ("ratio_step",)), ("ratio median intervals", ("ratio_step_median",)),
                 ("ratio start-up", ("ratio_startup",)))


def median_of_rounds(rounds: list[dict]) -> dict:
    """{label: median over the rounds} of every ROUND_FIGURES entry a round has."""
    def value(summary, path):
        for key in path:
            summary = summary.get(key) if isinstance(summary, dict) else None
        return summary

    out = {}
    for label, path in ROUND_FIGURES:
        values = [v for v in (value(r, path) for r in rounds) if v is not None]
        if values:
            out[label] = statistics.median(values)
    return out


def render_rounds(rounds: list[dict], medians: dict) -> str:
    """One line per round (its ratios and start-ups), then the medians over the rounds."""
    lines = [f"round {i + 1}: per step {r['ratio_step']:.2f} (median intervals {r.get('ratio_step_median', float('nan')):.2f})"
             f"  start-up ours {r['ours']['startup']:.1f} s / TRL {r['trl']['startup']:.1f} s"
             f"  load before {r['load_before']}" for i, r in enumerate(rounds)]
    lines.append(f"median of {len(rounds)} rounds: " + "  ".join(
        f"{label} {v:.2f}" + ("" if label.startswith("ratio") else " s") for label, v in medians.items()))
    return "\n".join(lines)


def run_round(opts, python: str, work: Path, hf, train, dist) -> dict:
    """The four commands (TRL short, ours short, TRL long, ours long) and their summary."""
    load_before = os.getloadavg()
    runs = {}
    for steps in (opts.short, opts.long):
        runs[f"trl-{steps}"] = run_trl(python, work, hf, train, steps)
        logger.warning("TRL %d steps: %.1f s", steps, runs[f"trl-{steps}"]["wall"])
        runs[f"ours-{steps}"] = run_ours(work, hf, train, dist, steps, opts.extra)
        logger.warning("ours %d steps: %.1f s", steps, runs[f"ours-{steps}"]["wall"])
    result = summarize(runs, opts.short, opts.long)
    result["load_before"] = [round(x, 1) for x in load_before]
    result["load_after"] = [round(x, 1) for x in os.getloadavg()]
    result["runs"] = runs
    result["extra"] = opts.extra
    return result


def main(argv=None) -> dict:
    opts = parse_args(argv)
    python = trl_python(Path(opts.trl_venv), opts.install_trl)
    work = Path(opts.work_dir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    hf, train, dist = _load_tool("bench_loop").prepare(work)
    rounds = []
    for _ in range(opts.repeat):
        rounds.append(run_round(opts, python, work, hf, train, dist))
        print(render(rounds[-1]), flush=True)
    result = rounds[0] if opts.repeat == 1 else {"rounds": rounds, "median": median_of_rounds(rounds)}
    if opts.repeat > 1:
        print(render_rounds(rounds, result["median"]))
    Path(opts.output).write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    main()
