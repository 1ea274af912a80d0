"""Helpers for converter tests: tiny MODEL_ARGS, running the two tools, comparing HF folders."""

import os
import subprocess
from pathlib import Path

import torch

from slime.utils.misc import free_port
from tests.warm_python import warm_python

REPO = Path(__file__).resolve().parents[4]

def model_args(script: str) -> list:
    """``MODEL_ARGS`` of ``scripts/models/<script>`` as the launch scripts pass them."""
    out = subprocess.run(
        ["bash", "-c", f'source "{REPO}/scripts/models/{script}"; printf "%s\\n" "${{MODEL_ARGS[@]}}"'],
        capture_output=True, text=True, check=True,
    ).stdout
    return out.splitlines()


TINY_DENSE_ARGS = model_args("qwen3-tiny.sh")
TINY_MOE_ARGS = model_args("qwen3-tiny-moe.sh")
TINY_DEEPSEEK_V3_ARGS = model_args("deepseek-v3-tiny.sh")
TINY_GLM4_MOE_ARGS = model_args("glm4.5-tiny.sh")


def run_tool(args, nproc: int = 1, timeout: int = 180) -> subprocess.CompletedProcess:
    """Run ``tools/<args[0]>`` with python (nproc 1) or torchrun; raises with output on failure.
    The interpreter of the tool, torchrun and its ranks is the session's warm one
    (tests/warm_python.py); torchrun starts it with `--no-python` (ranks unbuffered, as with `-u`)."""
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    script = str(REPO / "tools" / args[0])
    python = warm_python()
    if nproc == 1:
        cmd = [python, script, *args[1:]]
    else:
        env["PYTHONUNBUFFERED"] = "1"
        cmd = [python, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
               "--master-port", str(free_port()), "--no-python", python, script, *args[1:]]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc


def round_trip(hf_dir, work: Path, model_args, nproc: int = 1, layout=(), export_args=()) -> Path:
    """HF -> torch_dist (``nproc`` ranks, ``layout`` flags) -> HF; returns the exported folder."""
    save, out = work / "torch_dist", work / "hf_out"
    run_tool(["convert_hf_to_torch_dist.py", *model_args, *layout,
              "--hf-checkpoint", str(hf_dir), "--save", str(save)], nproc=nproc)
    run_tool(["convert_torch_dist_to_hf.py", "--input-dir", str(save / "iter_0000000"),
              "--output-dir", str(out), "--origin-hf-dir", str(hf_dir), *export_args])
    return out


def assert_same_weights(a_dir, b_dir) -> int:
    """Every tensor of ``a_dir/model.safetensors`` equals (torch.equal) ``b_dir``'s; returns count."""
    from safetensors.torch import load_file

    a = load_file(str(Path(a_dir) / "model.safetensors"))
    b = load_file(str(Path(b_dir) / "model.safetensors"))
    assert a.keys() == b.keys(), sorted(set(a) ^ set(b))
    different = [k for k in a if a[k].dtype != b[k].dtype or not torch.equal(a[k], b[k])]
    assert not different, different
    return len(a)
