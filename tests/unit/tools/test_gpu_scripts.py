"""GPU launch scripts for the dense Qwen3 models: scripts/models/qwen3-{4B,0.6B}.sh and
scripts/run-qwen3-{4B,0.6B}.sh.

The MODEL_ARGS are checked against the public Hugging Face config.json values of each model, the
run scripts' `--dry-run` is run for real (the entry point parses, validates and cross-checks the
flags against a config.json placed where the script looks for it), and the Ray part of a real
launch is run with a `ray` on PATH that only records its calls, to check the script stops only
the Ray it started. The user docs (quick start, GPU guide, architecture) are checked to name only
real flags and files.
"""

import json
import os
import re
import subprocess

import pytest

from tests.unit.tools.test_model_scripts import model_args
from tests.warm_python import warm_python

# Shape keys of Qwen/Qwen3-4B and Qwen/Qwen3-0.6B config.json (both tie their embeddings).
PUBLIC_CONFIGS = {
    "4B": {"architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "head_dim": 128,
           "hidden_act": "silu", "hidden_size": 2560, "intermediate_size": 9728,
           "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8,
           "rms_norm_eps": 1e-06, "rope_theta": 1000000, "tie_word_embeddings": True, "vocab_size": 151936},
    "0.6B": {"architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "head_dim": 128,
             "hidden_act": "silu", "hidden_size": 1024, "intermediate_size": 3072,
             "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
             "rms_norm_eps": 1e-06, "rope_theta": 1000000, "tie_word_embeddings": True, "vocab_size": 151936},
}
# (model, total parameters the plan should count in billions, trainer TP, engines x GPUs)
MODELS = [("4B", "4.022 B", "2", "4 x 2 GPUs"), ("0.6B", "0.596 B", "1", "8 x 1 GPUs")]
FLAG_TO_KEY = {
    "--num-layers": "num_hidden_layers", "--hidden-size": "hidden_size",
    "--ffn-hidden-size": "intermediate_size", "--num-attention-heads": "num_attention_heads",
    "--num-query-groups": "num_key_value_heads", "--kv-channels": "head_dim",
    "--vocab-size": "vocab_size", "--norm-epsilon": "rms_norm_eps", "--rotary-base": "rope_theta",
}
FIXED = {
    "--disable-bias-linear": True, "--qk-layernorm": True, "--group-query-attention": True,
    "--swiglu": True, "--normalization": "RMSNorm", "--position-embedding-type": "rope",
    "--rotary-percent": "1.0",
}


def _model_dir(tmp_path, model: str, **overrides) -> str:
    """A MODEL_DIR whose Qwen3-<model>/config.json holds the public values (plus overrides)."""
    hf = tmp_path / f"Qwen3-{model}"
    hf.mkdir(parents=True)
    (hf / "config.json").write_text(json.dumps({**PUBLIC_CONFIGS[model], **overrides}))
    return str(tmp_path)


def _run(repo_root, model: str, env: dict, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(repo_root / f"scripts/run-qwen3-{model}.sh"), *extra],
                          env={**os.environ, "PYTHON": warm_python(), **env},
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("model", list(PUBLIC_CONFIGS))
def test_model_args_match_public_config(repo_root, model):
    flags = model_args(repo_root, f"qwen3-{model}.sh")
    config = PUBLIC_CONFIGS[model]
    for flag, key in FLAG_TO_KEY.items():
        assert float(flags[flag]) == float(config[key]), f"{model}: {flag} {flags[flag]} != {key} {config[key]}"
    assert {f: flags.get(f) for f in FIXED} == FIXED
    # Tied embeddings: the flag that unties them must be absent, and nothing MoE may sneak in.
    assert set(flags) == set(FLAG_TO_KEY) | set(FIXED), f"{model}: unexpected {set(flags) ^ (set(FLAG_TO_KEY) | set(FIXED))}"


@pytest.mark.parametrize("model, params, tp, engines", MODELS)
def test_dry_run_prints_plan(repo_root, tmp_path, model, params, tp, engines):
    proc = _run(repo_root, model, {"MODEL_DIR": _model_dir(tmp_path, model)}, "--dry-run")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    out = proc.stdout
    assert "== Placement" in out and "global batch size" in out
    assert f"model parameters            : {params} total" in out
    assert f"TP / PP / CP                : {tp} / 1 / 1" in out
    assert f"engines                     : {engines}" in out
    assert "mode                        : colocated" in out
    assert "HF config cross-check of MODEL_ARGS skipped" not in proc.stderr  # the config was read
    assert "fits" in out.split("trainer verdict")[1].splitlines()[0]


@pytest.mark.parametrize("model", list(PUBLIC_CONFIGS))
def test_dry_run_rejects_untied_config(repo_root, tmp_path, model):
    proc = _run(repo_root, model, {"MODEL_DIR": _model_dir(tmp_path, model, tie_word_embeddings=False)},
                "--dry-run")
    assert proc.returncode != 0
    assert "--untie-embeddings-and-output-weights is not set" in proc.stderr


@pytest.mark.parametrize("env, mode, trainer_gpus", [
    ({"COLOCATE": "0"}, "disaggregated", "0-3"),
    ({"ASYNC": "1"}, "disaggregated", "0-3"),
])
def test_dry_run_modes(repo_root, tmp_path, env, mode, trainer_gpus):
    proc = _run(repo_root, "4B", {"MODEL_DIR": _model_dir(tmp_path, "4B"), **env}, "--dry-run")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert f"mode                        : {mode}" in proc.stdout
    assert f"trainer GPUs                : {trainer_gpus}" in proc.stdout


def test_async_refuses_colocate_flag(repo_root, tmp_path):
    """ASYNC=1 runs train_async.py: a --colocate appended by the user is refused by it."""
    proc = _run(repo_root, "0.6B", {"MODEL_DIR": _model_dir(tmp_path, "0.6B"), "ASYNC": "1"},
                "--dry-run", "--colocate")
    assert proc.returncode != 0 and "train_async" in proc.stderr


def test_extra_flags_override_multi_node(repo_root, tmp_path):
    proc = _run(repo_root, "4B", {"MODEL_DIR": _model_dir(tmp_path, "4B")}, "--dry-run", "--actor-num-nodes", "2")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "GPUs                        : 16 on 2 node(s) x 8" in proc.stdout


def _fake_ray(tmp_path, status_rc: int) -> dict:
    """A `ray` on PATH that logs each call and answers `ray status` with `status_rc`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "ray.log"
    script = bin_dir / "ray"
    script.write_text(f'#!/bin/bash\nprintf "%s\\0" "$@" "ENV=${{RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER-unset}},${{RAY_AUTH_MODE-unset}}" >> "{log}"\n'
                      f'echo >> "{log}"\nif [ "$1" = status ]; then exit {status_rc}; fi\nexit 0\n')
    script.chmod(0o755)
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "LOG": str(log)}


@pytest.mark.parametrize("status_rc, starts, master", [(1, True, ""), (0, False, ""), (1, True, "10.0.0.5")])
def test_stops_only_the_ray_it_started(repo_root, tmp_path, status_rc, starts, master):
    fake = _fake_ray(tmp_path, status_rc)
    proc = _run(repo_root, "0.6B", {"MODEL_DIR": str(tmp_path), "PATH": fake["PATH"], "ASYNC": "1",
                                    "MASTER_ADDR": master})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    calls = [line.split("\0") for line in open(fake["LOG"]).read().split("\0\n")[:-1]]
    verbs = [c[0] for c in calls]
    assert verbs == (["status", "start", "job", "stop"] if starts else ["status", "job"])
    # one node: Ray's servers on loopback (docs/security.md), and every Ray command in that mode
    # (else it looks for the head at the node's IP); the CLI sends the cluster token
    assert {c[-1] for c in calls} == {"ENV=unset,token" if master else "ENV=0,token"}
    start = [c for c in calls if c[0] == "start"]
    assert not start or start[0][start[0].index("--node-ip-address") + 1] == (master or "127.0.0.1")
    submit = next(c for c in calls if c[:2] == ["job", "submit"])
    cmd = submit[submit.index("--") + 1:]
    assert cmd[:4] == [warm_python(), f"{repo_root}/train_async.py", "--actor-num-nodes", "1"]  # $PYTHON
    assert "--colocate" not in cmd and cmd[cmd.index("--rollout-num-gpus") + 1] == "4"
    env = json.loads(next(a for a in submit if a.startswith("--runtime-env-json="))[len("--runtime-env-json="):])
    assert env["env_vars"]["PYTHONPATH"] == str(repo_root)
    assert cmd[cmd.index("--metrics-dir") + 1] == f"{tmp_path}/Qwen3-0.6B_slime/metrics"


# Flags of the outside commands the GPU guide shows (ray, torchrun, huggingface-cli, pip).
EXTERNAL_FLAGS = {"--address", "--disable-usage-stats", "--head", "--local-dir", "--no-build-isolation",
                  "--node-ip-address", "--nproc-per-node", "--num-gpus", "--repo-type",
                  "--config-settings", "--build-option", "--cpp", "--cuda",  # pip's apex build (--cpp_ext, --cuda_ext)
                  "--data-parallel-random-init", "--no-ckpt-fully-parallel-save",  # Megatron-LM's checkpoint options
                  "--sglang-"}  # the family written `--sglang-*`
FLAG_RE = r"(?<![\w-])--[a-z][a-z0-9-]*"


def _tool_flags(repo_root, tool: str) -> set[str]:
    out = subprocess.run([warm_python(), str(repo_root / "tools" / tool), "--help"], capture_output=True,
                         text=True, check=True, timeout=120).stdout
    return set(re.findall(FLAG_RE, out))


def test_docs_name_real_flags_and_files(repo_root):
    """Every --flag in the user docs is one of train.py's, a tool's or an outside command's, and
    every repository path they name exists."""
    from slime.utils.arguments import build_parser
    from slime.utils.arguments.sglang import fallback_server_arg_fields

    # plus SGLang's own launch_server options, which the guide names when it shows launch lines
    known = set(EXTERNAL_FLAGS) | {entry["flag"] for entry in fallback_server_arg_fields()}
    for entry in ("train", "train_async"):
        known |= {s for action in build_parser(entry)._actions for s in action.option_strings}
    for tool in ("convert_torch_dist_to_hf.py", "plot_metrics.py", "make_tiny_model.py"):
        known |= _tool_flags(repo_root, tool)
    for doc in ("quick-start.md", "gpu-guide.md", "architecture.md", "adding-a-model.md"):
        text = (repo_root / "docs" / doc).read_text()
        assert not set(re.findall(FLAG_RE, text)) - known, f"docs/{doc}: unknown flags {set(re.findall(FLAG_RE, text)) - known}"
        paths = set(re.findall(r"\b((?:scripts|tools|slime|docs|tests)/[\w./-]*\w/?)", text))
        assert paths and not {p for p in paths if not (repo_root / p).exists()}, f"docs/{doc}: missing paths"
