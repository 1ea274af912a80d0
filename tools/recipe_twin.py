"""CPU twin of a GPU recipe (`scripts/run-*.sh`): the recipe's own flags, with only the model, the
paths and the device swapped, for two rollouts, a weight sync, a save and a resume.

How a twin is built (DESIGN.md §2b rule 4):
1. **Flags from the recipe script itself.** The recipe runs with `SLIME_TWIN_ARGV=FILE` and
   `MODEL_DIR=<twin folder>`: `run_train_job` (scripts/lib/ray_job.sh) writes the entry point, its
   argv and the recipe's `MODEL_ARGS` to FILE instead of starting Ray. So the paths are the
   recipe's own, under the twin folder, and every other flag is verbatim.
2. **GPU-only knobs validated on the GPU layout.** The recipe's untouched argv (GPU model, GPU
   layout) goes through `train.py --dry-run` first: megatron-core's and SGLang's config objects
   and launch lines are built with the GPU run's values, and the knobs the CPU run cannot honour
   (`GPU_ONLY`) are listed with what the twin does instead.
3. **Model**: the recipe's `MODEL_ARGS` are replaced by its family's tiny `scripts/models/*-tiny*.sh`
   flags, reshaped (`tiny_shape`) so every parallel size of the layout divides heads, query groups,
   experts, layers (PP) and vocab; `tools/make_tiny_model.py` writes the matching HF checkpoint at
   the recipe's `--hf-checkpoint` path, converted to torch_dist at its `--ref-load` path.
4. **Device**: GPUs become gloo ranks (`--actor-num-nodes 1 --actor-num-gpus-per-node N`). A layout
   with more ranks than `--max-ranks` keeps TP/PP/EP and drops data-parallel replicas (and nodes);
   when TP*PP alone is too many, the larger is halved until it fits and EP shrinks to what the
   expert layout allows. CP becomes 1 (megatron's context-parallel attention is Transformer
   Engine's); every changed size is printed (`fit_layout`).
5. **Unavoidable overrides** (`RUN_OVERRIDES_DOC`, printed): two rollouts, then a resume for a
   third, two prompts per rollout (the global batch scaled by the same factor, so steps per rollout
   stay the recipe's), 8-token responses, and small data files whose prompts ask for the `random`
   reward in their metadata (`DATA_REWARD`). Nothing else changes.

Usage: python tools/recipe_twin.py NAME [--max-ranks 8] [--work-dir runs/twins]
(NAME: qwen3-30B-A3B for scripts/run-qwen3-30B-A3B.sh). Exit 0 when the twin passed.
"""


import argparse
import json
import logging
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
logger = logging.getLogger("recipe_twin")

# Flags the CPU run cannot honour as the GPU run does: flag -> what the twin does instead. The GPU
# values are checked by the recipe's own --dry-run (step 2 above).
GPU_ONLY = {
    "--bf16": "validated by the GPU dry run; the CPU trainer computes as train.py does on CPU",
    "--attention-backend": "validated by the GPU dry run (TE attention); CPU runs megatron's local core attention",
    "--moe-grouped-gemm": "model flag of the GPU family, replaced with the tiny family's (no grouped GEMM on CPU)",
    "--moe-permute-fusion": "model flag of the GPU family, replaced with the tiny family's (fused permute is CUDA)",
    "--moe-token-dispatcher-type": "GPU family's dispatcher validated by the dry run; the tiny family's runs on CPU",
    "--overlap-cpu-optimizer-d2h-h2d": "CUDA streams on GPU; on CPU the copies are synchronous",
    "--sglang-": "SGLang launch line validated by the GPU dry run; the local engine serves on CPU",
}
# (flag, value or None to drop) every twin run sets, whatever the recipe says; printed by `main`.
RUN_OVERRIDES_DOC = (
    ("--num-rollout", "2 (then 3 when resuming)", "two rollouts and one more after the resume"),
    ("--rollout-batch-size", "2", "two prompts per rollout (CPU time)"),
    ("--global-batch-size", "recipe value x 2 / recipe rollout batch", "same optimizer steps per rollout"),
    ("--rollout-max-response-len", "8", "short responses (CPU time)"),
    ("--eval-max-response-len", "8", "short responses (CPU time)"),
    ("--override-opt-param-scheduler", "(resume only)", "the resume extends the run from 2 to 3 rollouts; "
     "megatron's scheduler refuses a checkpoint with another total unless told (RESUME_EXTRA)"),
    ("train data", "64 toy prompts, metadata rm_type=random", "non-zero advantages (DATA_REWARD)"),
)
TWIN_ROLLOUT_BATCH, TWIN_RESPONSE_LEN = 2, 8
# The twin's train prompts name this reward in their metadata (which wins over --rm-type, as in
# slime): a random tiny model never writes the recipes' `</think> ... \\boxed{}` answer, so their
# reward would be 0 for every sample, every GRPO advantage 0 and every gradient 0; random 0/1
# rewards make the twin train for real. The recipe's --rm-type flag itself stays verbatim.
DATA_REWARD = "random"
# The resume goes on to a third rollout: megatron's OptimizerParamScheduler asserts that the total
# (--num-rollout steps) equals the checkpoint's unless one of its two override flags is given.
RESUME_EXTRA = ("--override-opt-param-scheduler",)


@dataclass(frozen=True)
class Recipe:
    """What the recipe script handed over: entry point, full argv and its MODEL_ARGS."""

    name: str
    entry: str
    argv: list[str]
    model_args: list[str]


@dataclass(frozen=True)
class Layout:
    """Parallel sizes and GPUs of a run."""

    nodes: int
    gpus_per_node: int
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int = 1

    @property
    def world(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def dp(self) -> int:
        return self.world // (self.tp * self.pp * self.cp)


LAYOUT_FLAGS = {"tp": "--tensor-model-parallel-size", "pp": "--pipeline-model-parallel-size",
                "cp": "--context-parallel-size", "ep": "--expert-model-parallel-size",
                "etp": "--expert-tensor-parallel-size"}


def flag_value(argv: list[str], flag: str, default: str | None = None) -> str | None:
    """The value after the last `flag` in `argv`, or `default`."""
    idx = [i for i, a in enumerate(argv) if a == flag]
    return argv[idx[-1] + 1] if idx else default


def set_flag(argv: list[str], flag: str, value: str | None) -> list[str]:
    """`argv` with `flag`'s value replaced (appended when absent); value None drops the flag and its value."""
    out, i, found = [], 0, False
    while i < len(argv):
        if argv[i] == flag:
            found = True
            if value is not None:
                out += [flag, value]
            i += 2
            continue
        out.append(argv[i])
        i += 1
    if not found and value is not None:
        out += [flag, value]
    return out


def capture(name: str, model_dir: Path, env: dict[str, str]) -> Recipe:
    """Run scripts/run-NAME.sh in twin mode (SLIME_TWIN_ARGV) with MODEL_DIR=`model_dir`."""
    script = REPO_ROOT / "scripts" / f"run-{name}.sh"
    if not script.is_file():
        raise FileNotFoundError(f"no recipe {script}")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "argv"
        proc = subprocess.run(["bash", str(script)], env={**env, "SLIME_TWIN_ARGV": str(out),
                                                         "MODEL_DIR": str(model_dir)},
                              capture_output=True, text=True, cwd=REPO_ROOT)
        if proc.returncode != 0 or not out.is_file():
            raise RuntimeError(f"{script} in twin mode failed ({proc.returncode}): {proc.stderr[-2000:]}")
        entry, *argv = out.read_text().split("\0")[:-1]
        model_args = Path(f"{out}.model").read_text().split("\0")[:-1]
    return Recipe(name, entry, argv, model_args)


def recipe_layout(argv: list[str]) -> Layout:
    """The recipe's GPUs and parallel sizes, read from its flags."""
    sizes = {k: int(flag_value(argv, f, "1")) for k, f in LAYOUT_FLAGS.items()}
    return Layout(nodes=int(flag_value(argv, "--actor-num-nodes", "1")),
                  gpus_per_node=int(flag_value(argv, "--actor-num-gpus-per-node", "1")), **sizes)


def _expert_fits(layout: Layout) -> bool:
    # megatron-core: world / PP = ETP * EP * expert-DP
    return (layout.world // layout.pp) % (layout.etp * layout.ep) == 0


# SGLang parallel sizes that must divide an engine's GPUs (--rollout-num-gpus-per-engine)
ENGINE_SIZE_FLAGS = ("--sglang-ep-size", "--sglang-dp-size")
CP_REASON = " (context-parallel attention needs Transformer Engine: GPU only)"


def fit_layout(gpu: Layout, max_ranks: int) -> tuple[Layout, list[str]]:
    """The largest layout of at most `max_ranks` ranks on one node (module docstring, step 4) and
    the list of changed parallel sizes ("PP 4 -> 2"); data-parallel replicas are dropped first."""
    # megatron-core's context-parallel attention is Transformer Engine's: CPU runs CP 1
    sizes = {"tp": gpu.tp, "pp": gpu.pp, "cp": 1}
    while math.prod(sizes.values()) > max_ranks:
        # halve the largest (ties: CP, then PP, then TP) so every kind of parallelism stays > 1 longest
        key = max(("cp", "pp", "tp"), key=lambda k: sizes[k])
        sizes[key] //= 2
    model_parallel = math.prod(sizes.values())
    dp = gpu.dp if model_parallel == gpu.tp * gpu.pp else 1
    while model_parallel * dp > max_ranks or dp > 1 and gpu.dp % dp:
        dp -= 1
    layout = replace(gpu, nodes=1, gpus_per_node=model_parallel * dp, **sizes)
    while not _expert_fits(layout):
        layout = replace(layout, ep=layout.ep // 2) if layout.ep > 1 else replace(layout, etp=layout.etp // 2)
    changed = [f"{k.upper()} {getattr(gpu, k)} -> {getattr(layout, k)}" + (CP_REASON if k == "cp" else "")
               for k in LAYOUT_FLAGS if getattr(gpu, k) != getattr(layout, k)]
    return layout, changed


def _tiny_config(family: str) -> dict:
    """The config.json keys the tiny variant `family` adds to the shared tiny shape."""
    from slime.models import tiny_variant

    return dict(tiny_variant(family)[1].config)


def _expert_key(config: dict) -> str | None:
    from slime.models.hf_args import EXPERT_KEYS

    return next((key for key in EXPERT_KEYS if key in config), None)


def tiny_shape(family: str, layout: Layout, last_stage_layers: int | None) -> dict:
    """make_tiny_model config overrides so TP divides heads, query groups and vocab, EP the experts
    and PP the layers (with `last_stage_layers` on the last stage, as the recipe says)."""
    config = _tiny_config(family)
    heads = math.lcm(4, layout.tp)
    shape = {"num_attention_heads": heads, "vocab_size": 128 * layout.tp}
    # multi-latent attention has as many KV heads as heads
    shape["num_key_value_heads"] = heads if "kv_lora_rank" in config else max(2, layout.tp)
    if _expert_key(config):
        shape[_expert_key(config)] = math.lcm(8, layout.ep)
    # As in the released models, every stage holds MoE layers: a variant whose first layer is dense
    # (first_k_dense_replace 1) gets two layers per stage.
    per_stage = 2 if config.get("first_k_dense_replace") else max(1, math.ceil(2 / layout.pp))
    if last_stage_layers:
        shape["num_hidden_layers"] = (layout.pp - 1) * per_stage + last_stage_layers
    else:
        shape["num_hidden_layers"] = layout.pp * per_stage
    return shape


def tiny_model_args(family: str, script: str, shape: dict) -> list[str]:
    """The tiny family's MODEL_ARGS (sourced from scripts/models/`script`) with `shape` applied."""
    proc = subprocess.run(["bash", "-c", f'source "$0"; printf "%s\\0" "${{MODEL_ARGS[@]}}"',
                           str(REPO_ROOT / "scripts" / "models" / script)], capture_output=True, text=True, check=True)
    args = proc.stdout.split("\0")[:-1]
    layers = shape["num_hidden_layers"]
    args = set_flag(args, "--num-attention-heads", str(shape["num_attention_heads"]))
    args = set_flag(args, "--vocab-size", str(shape["vocab_size"]))
    args = set_flag(args, "--num-layers", str(layers))
    if "--num-query-groups" in args:
        args = set_flag(args, "--num-query-groups", str(shape["num_key_value_heads"]))
    config = _tiny_config(family)
    if _expert_key(config):
        args = set_flag(args, "--num-experts", str(shape[_expert_key(config)]))
        dense = int(config.get("first_k_dense_replace") or 0)
        freq = f"[0]*{dense}+[1]*{layers - dense}" if dense else f"[1]*{layers}"
        args = set_flag(args, "--moe-layer-freq", freq)
    return args


def swap_model(argv: list[str], old: list[str], new: list[str]) -> list[str]:
    """`argv` with the contiguous run `old` (the recipe's MODEL_ARGS) replaced by `new`."""
    for i in range(len(argv) - len(old) + 1):
        if argv[i:i + len(old)] == old:
            return argv[:i] + new + argv[i + len(old):]
    raise ValueError("the recipe's MODEL_ARGS are not one contiguous run of its flags")


def family_of(model_args: list[str]) -> tuple[str, str]:
    """(make_tiny_model variant, scripts/models/ tiny flags file) of a recipe's MODEL_ARGS: the one
    tiny variant of `slime.models` whose `recipe_match` accepts them."""
    from slime.models import tiny_variant, tiny_variant_for_recipe

    variant = tiny_variant_for_recipe(model_args)
    return variant, tiny_variant(variant)[1].script


def gpu_only_knobs(argv: list[str]) -> list[str]:
    """Lines "FLAG VALUE: what the twin does" for the GPU-only knobs present in `argv`."""
    lines = []
    for i, arg in enumerate(argv):
        note = next((n for f, n in GPU_ONLY.items() if arg == f or f.endswith("-") and arg.startswith(f)), None)
        if note:
            values = []
            for v in argv[i + 1:]:
                if v.startswith("--"):
                    break
                values.append(v)
            lines.append(f"{' '.join([arg, *values])}: {note}")
    return lines


@dataclass
class Twin:
    """One twin: the recipe, the CPU layout, the run argv and what was changed (printed)."""

    recipe: Recipe
    folder: Path
    layout: Layout
    family: str
    shape: dict
    argv: list[str]
    model_args: list[str]
    changes: list[str] = field(default_factory=list)


def build_twin(recipe: Recipe, folder: Path, max_ranks: int) -> Twin:
    """The twin's argv and changes (module docstring, steps 3-5); writes nothing."""
    argv = list(recipe.argv)
    gpu = recipe_layout(argv)
    layout, changes = fit_layout(gpu, max_ranks)
    for key, flag in LAYOUT_FLAGS.items():
        if getattr(layout, key) != getattr(gpu, key):
            argv = set_flag(argv, flag, str(getattr(layout, key)))
    last = flag_value(argv, "--decoder-last-pipeline-num-layers")
    if last and layout.pp == 1:
        argv = set_flag(argv, "--decoder-last-pipeline-num-layers", None)
        changes.append(f"--decoder-last-pipeline-num-layers {last} dropped (PP 1)")
        last = None
    family, script = family_of(recipe.model_args)
    shape = tiny_shape(family, layout, int(last) if last else None)
    model_args = tiny_model_args(family, script, shape)
    argv = swap_model(argv, recipe.model_args, model_args)
    device = {"--actor-num-nodes": "1", "--actor-num-gpus-per-node": str(layout.world)}
    engine_gpus = int(flag_value(argv, "--rollout-num-gpus-per-engine", "1"))
    if engine_gpus > layout.world:
        device["--rollout-num-gpus-per-engine"] = str(layout.world)
        # the engine's own parallel sizes shrink with its GPUs, as the trainer's do
        for flag in ENGINE_SIZE_FLAGS:
            if flag_value(argv, flag):
                device[flag] = str(math.gcd(int(flag_value(argv, flag)), layout.world))
    if flag_value(argv, "--rollout-num-gpus") and "--colocate" not in argv:
        device["--rollout-num-gpus"] = str(min(int(flag_value(argv, "--rollout-num-gpus")), layout.world))
    for flag, value in device.items():
        if flag_value(argv, flag) != value:
            changes.append(f"{flag} {flag_value(argv, flag)} -> {value} (device)")
        argv = set_flag(argv, flag, value)
    rollout_batch = int(flag_value(argv, "--rollout-batch-size"))
    overrides = {"--rollout-batch-size": str(TWIN_ROLLOUT_BATCH),
                 "--global-batch-size": str(int(flag_value(argv, "--global-batch-size")) * TWIN_ROLLOUT_BATCH
                                            // rollout_batch),
                 "--rollout-max-response-len": str(TWIN_RESPONSE_LEN)}
    if flag_value(argv, "--eval-max-response-len"):
        overrides["--eval-max-response-len"] = str(TWIN_RESPONSE_LEN)
    if not flag_value(argv, "--metrics-dir"):
        overrides["--metrics-dir"] = str(folder / "model_dir" / "metrics")
    for flag, value in overrides.items():
        kind = "path" if flag == "--metrics-dir" else "run size"
        changes.append(f"{flag} {flag_value(argv, flag)} -> {value} ({kind})")
        argv = set_flag(argv, flag, value)
    return Twin(recipe, folder, layout, family, shape, argv, model_args, changes)


def run_logged(cmd: list[str], log: Path, env: dict[str, str], timeout: float) -> None:
    """Run `cmd` in the repo root, output to `log`; RuntimeError naming the log's first error."""
    with open(log, "w") as out:
        try:
            code = subprocess.run(cmd, cwd=REPO_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                  timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            code = f"timeout after {timeout:.0f}s"
    if code != 0:
        raise RuntimeError(f"{Path(cmd[1]).name} failed ({code}): {first_error(log)} [log {log}]")


def first_error(log: Path) -> str:
    """The first line of `log` that reads like an error (a Traceback's last line), else its last line."""
    lines = log.read_text(errors="replace").splitlines()
    for i, line in enumerate(lines):
        if line.startswith("Traceback"):
            tail = next((l for l in lines[i + 1:] if l and not l.startswith((" ", "Traceback"))), line)
            return tail.strip()
    marks = [l for l in lines if "Error" in l or "error:" in l]
    return (marks[0] if marks else (lines[-1] if lines else "empty log")).strip()[:400]


def write_train_data(source: Path, target: Path, metadata_key: str) -> None:
    """The toy prompts at `target`, each row's metadata naming the `random` reward (`DATA_REWARD`)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    rows = [json.loads(line) for line in source.read_text().splitlines() if line.strip()]
    for row in rows:
        row[metadata_key] = {**row.get(metadata_key, {}), "rm_type": DATA_REWARD}
    target.write_text("".join(json.dumps(row) + "\n" for row in rows))


def prepare_inputs(twin: Twin, env: dict[str, str], timeout: float, python: str = sys.executable) -> None:
    """The tiny checkpoint at every --hf-checkpoint path, its torch_dist at --ref-load, the toy
    data at --prompt-data and every --eval-prompt-data path (small files: the run is short)."""
    argv, py = twin.argv, python
    hf = Path(flag_value(argv, "--hf-checkpoint"))
    config = [f"{k}={json.dumps(v)}" for k, v in twin.shape.items()]
    # FP8=1 recipes serve a block-FP8 checkpoint; the trainer's reference is the float one
    fp8 = ["--fp8"] if hf.name.endswith("-FP8") else []
    run_logged([py, "tools/make_tiny_model.py", "--output-dir", str(hf), "--variant", twin.family,
                "--config", *config, *fp8], twin.folder / "make_tiny_model.log", env, timeout)
    float_hf = hf.with_name(hf.name[:-len("-FP8")]) if fp8 else hf
    if fp8:
        run_logged([py, "tools/make_tiny_model.py", "--output-dir", str(float_hf), "--variant", twin.family,
                    "--config", *config], twin.folder / "make_tiny_model_float.log", env, timeout)
    run_logged([py, "tools/convert_hf_to_torch_dist.py", *twin.model_args, "--hf-checkpoint", str(float_hf),
                "--save", flag_value(argv, "--ref-load")], twin.folder / "convert.log", env, timeout)
    data = twin.folder / "toy_data"
    run_logged([py, "tools/make_toy_data.py", "--output-dir", str(data), "--seed", "0", "--num-train", "64",
                "--num-eval", "2"], twin.folder / "make_toy_data.log", env, timeout)
    write_train_data(data / "train.jsonl", Path(flag_value(argv, "--prompt-data")),
                     flag_value(argv, "--metadata-key", "metadata"))
    evals = argv[argv.index("--eval-prompt-data") + 1:] if "--eval-prompt-data" in argv else []
    paths = []
    for value in evals:
        if value.startswith("--"):
            break
        paths.append(value)
    for path in paths[1::2]:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(data / "eval.jsonl", path)


def twin_env() -> dict[str, str]:
    """The environment of the recipe script and of every run: no GPU, one OpenMP thread per
    process, the repo importable (its code, not an installed copy), this interpreter as PYTHON."""
    env = dict(os.environ)
    env.update(CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", PYTHONPATH=str(REPO_ROOT), PYTHON=sys.executable)
    env.pop("RAY_ADDRESS", None)
    return env


def rollout_ids(metrics: Path) -> list[int]:
    """Rollout ids with a train row in metrics.jsonl."""
    if not metrics.is_file():
        return []
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    return sorted({r["rollout_id"] for r in rows if "rollout/raw_reward" in r})


def check_checkpoint(argv: list[str], iteration: int) -> None:
    """--save's tracker names `iteration` (RuntimeError otherwise)."""
    tracker = Path(flag_value(argv, "--save")) / "latest_checkpointed_iteration.txt"
    seen = tracker.read_text().strip() if tracker.is_file() else "missing"
    if seen != str(iteration):
        raise RuntimeError(f"{tracker}: {seen}, expected {iteration}")


def run_twin(name: str, work_dir: Path, max_ranks: int, timeout: float, prep_python: str = sys.executable) -> Twin:
    """Build and run the twin of scripts/run-NAME.sh (module docstring); RuntimeError on failure.
    `prep_python` runs the steps before the two jobs (the GPU dry run, the tiny model, its
    conversion, the data): the test suite passes its warm interpreter (tests/warm_python.py)."""
    env = twin_env()
    folder = (work_dir / name).resolve()
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    recipe = capture(name, folder / "model_dir", env)
    py = sys.executable
    logger.info("[%s] GPU dry run of the recipe's own flags (GPU model and layout)", name)
    run_logged([prep_python, recipe.entry, *recipe.argv, "--dry-run"], folder / "gpu_dry_run.log", env, timeout)
    twin = build_twin(recipe, folder, max_ranks)
    gpu = recipe_layout(recipe.argv)
    logger.info("[%s] family %s, tiny shape %s", name, twin.family, twin.shape)
    logger.info("[%s] layout GPU %d x %d (TP%d PP%d CP%d EP%d ETP%d DP%d) -> CPU %d gloo ranks (TP%d PP%d CP%d "
                "EP%d ETP%d DP%d)", name, gpu.nodes, gpu.gpus_per_node, gpu.tp, gpu.pp, gpu.cp, gpu.ep, gpu.etp,
                gpu.dp, twin.layout.world, *(getattr(twin.layout, k) for k in LAYOUT_FLAGS), twin.layout.dp)
    for line in twin.changes:
        logger.info("[%s] changed: %s", name, line)
    for line in gpu_only_knobs(recipe.argv):
        logger.info("[%s] GPU-only: %s", name, line)
    prepare_inputs(twin, env, timeout, prep_python)
    (folder / "twin_argv.json").write_text(json.dumps([recipe.entry, *twin.argv], indent=1))
    metrics = Path(flag_value(twin.argv, "--metrics-dir")) / "metrics.jsonl"
    logger.info("[%s] run 1: 2 rollouts, weight syncs, save", name)
    run_logged([py, recipe.entry, *set_flag(twin.argv, "--num-rollout", "2")], folder / "run1.log", env, timeout)
    if rollout_ids(metrics) != [0, 1]:
        raise RuntimeError(f"run 1 logged rollouts {rollout_ids(metrics)}, expected [0, 1] ({metrics})")
    check_checkpoint(twin.argv, 1)
    logger.info("[%s] run 2: resume from --load, one more rollout, save", name)
    resume = [*set_flag(twin.argv, "--num-rollout", "3"), *RESUME_EXTRA]
    run_logged([py, recipe.entry, *resume], folder / "run2.log", env, timeout)
    if 2 not in rollout_ids(metrics):
        raise RuntimeError(f"run 2 (resume) logged rollouts {rollout_ids(metrics)}, expected 2 among them")
    check_checkpoint(twin.argv, 2)
    return twin


def _parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("name", help="recipe name: scripts/run-NAME.sh")
    parser.add_argument("--max-ranks", type=int, default=8, help="most gloo ranks one machine runs (default 8)")
    parser.add_argument("--work-dir", type=Path, default=REPO_ROOT / "runs" / "twins",
                        help="twin folders go to WORK_DIR/NAME (emptied first)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per step (dry run, conversion, run)")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    cli = _parse_args(argv)
    for flag, value, why in RUN_OVERRIDES_DOC:
        logger.info("[%s] override: %s %s (%s)", cli.name, flag, value, why)
    start = time.monotonic()
    try:
        run_twin(cli.name, cli.work_dir, cli.max_ranks, cli.timeout)
    except (RuntimeError, FileNotFoundError, ValueError) as err:
        logger.error("[%s] FAILED after %.0f s: %s", cli.name, time.monotonic() - start, err)
        return 1
    logger.info("[%s] PASSED in %.0f s", cli.name, time.monotonic() - start)
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    sys.exit(main())
