"""Fixtures for the local engine tests: free ports, a running engine subprocess, HF references."""


import pytest
import torch

from slime.backends.local_engine.launcher import launch_local_engine, stop_local_engine
from slime.utils.misc import free_port


@pytest.fixture(scope="module")
def engine_factory(tmp_path_factory):
    """Start engines (`start(model_path, *extra_args) -> base_url`); all are stopped after the module."""
    procs = []

    def start(model_path, *extra_args):
        port = free_port()
        log = tmp_path_factory.mktemp("engine_log") / "engine.log"
        args = ("--num-threads", "1", *extra_args)
        procs.append(launch_local_engine(model_path, port, extra_args=args, timeout=120, log_path=str(log)))
        return f"http://127.0.0.1:{port}"

    yield start
    for proc in procs:
        stop_local_engine(proc)


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """The reference forwards in this process run single-threaded (2 shared cores), restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def hf_greedy(model, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """transformers' greedy `generate` continuation of one prompt (new tokens only)."""
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=max_new_tokens, do_sample=False,
                             attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long))
    return out[0, len(prompt_ids):].tolist()


def hf_logprobs(model, prompt_ids: list[int], output_ids: list[int], temperature: float) -> torch.Tensor:
    """log_softmax(logits / T) of each output token given its prefix (T = 0 means raw logits)."""
    ids = torch.tensor([prompt_ids + output_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].float()
    logp = torch.log_softmax(logits / (temperature if temperature > 0 else 1.0), dim=-1)
    return logp.gather(1, torch.tensor(output_ids)[:, None])[:, 0]


def write_dequantized_copy(fp8_folder, dst, named=None):
    """Write to `dst` the float32 HF checkpoint an FP8 one stands for (`named` replaces its
    tensors when given): FP8 weights dequantised, scales dropped, no quantization_config."""
    import json
    import shutil
    from pathlib import Path

    from safetensors.torch import load_file, save_file

    from slime.backends.local_engine.fp8 import Fp8Weights

    shutil.copytree(fp8_folder, dst, dirs_exist_ok=True)
    config = json.loads((Path(dst) / "config.json").read_text())
    config.pop("quantization_config")
    (Path(dst) / "config.json").write_text(json.dumps(config))
    named = named if named is not None else load_file(str(Path(fp8_folder) / "model.safetensors"))
    plain = Fp8Weights.from_checkpoint(fp8_folder).dequantize_named(named.items())
    save_file({n: t.float().contiguous() for n, t in plain}, str(Path(dst) / "model.safetensors"))
    return Path(dst)
