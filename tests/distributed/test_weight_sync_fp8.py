"""FP8 engines: a 2-rank EP=2 Megatron trainer (fp32 weights from the tiny MoE) syncs into a local
engine serving the tiny block-FP8 checkpoint (`--hf-checkpoint` points at it, as FP8=1 recipes
do) and into one serving the unquantised checkpoint.

What must hold after a train step and a sync:
- the tensors sent have exactly the names, dtypes and shapes of the FP8 checkpoint, and the
  distributed and the tensor (colocated) senders leave the engine in the same state;
- the FP8 engine computes with exactly the block-quantised trained weights (its log-probs equal
  transformers' on dequantise(quantise(trained weights)) within 1e-5);
- its log-probs match the trainer's within the FP8 tolerance below, and are not equal to them
  (> 1e-4: quantisation happened), while the unquantised engine matches within 1e-5;
- an unquantised sync into the FP8 engine is refused (400), never loaded.

FP8 tolerance. e4m3 rounds each weight to within 2^-4 of itself (slime.utils.fp8). A log-prob
moves by at most twice the largest logit change (|d log p_t| <= |dz_t| + |d logsumexp z| <=
2 max|dz|), and to first order the quantised network moves the logits by at most 2^-4 of their
spread (max - min over the vocabulary, the only part log-softmax sees): tol = 2 * 2^-4 * spread.
This is a first-order estimate, not a proof (attention softmax and MoE top-k routing are
nonlinear). Measured on the tiny MoE with seeds 0-3, at init and with 0.05 noise on every
weight: the largest change was 0.025-0.033 against tol 0.116-0.133 at init and 0.097-0.111
against 0.32-0.35 with noise (3.5-5x margin).
"""

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from slime.backends.local_engine.launcher import launch_local_engine, stop_local_engine
from slime.backends.megatron_utils.update_weight import UpdateWeightFromDistributed
from slime.backends.megatron_utils.update_weight.check import probe_prompt
from slime.utils.engine_client import EngineHTTPError, SyncEngineClient
from slime.utils.fp8 import fp8_config_from_hf, quantize_named
from tests.distributed.megatron_harness import build_trainer, fixed_rollout_data, free_port
from tests.unit.backends.local_engine.conftest import hf_logprobs, write_dequantized_copy
from tests.unit.backends.megatron_utils.spawn_util import spawn_until_exit

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def engines(tiny_moe_fp8_hf, tiny_moe_hf, tmp_path_factory):
    """{"fp8": URL of an engine on the FP8 checkpoint, "plain": one on the unquantised checkpoint}."""
    procs, urls = [], {}
    for kind, folder in (("fp8", tiny_moe_fp8_hf), ("plain", tiny_moe_hf)):
        port = free_port()
        log = tmp_path_factory.mktemp(f"engine_{kind}") / "engine.log"
        procs.append(launch_local_engine(folder, port, extra_args=("--num-threads", "1"), timeout=120,
                                         log_path=str(log)))
        urls[kind] = f"http://127.0.0.1:{port}"
    yield urls
    for proc in procs:
        stop_local_engine(proc)


def _worker(rank: int, world: int, port: int, plain_dir: str, fp8_dir: str, urls: dict, out: str):
    from slime.backends.megatron_utils.hf_io import read_hf_config, save_hf_checkpoint
    from slime.backends.megatron_utils.parallel import destroy_parallel
    from slime.backends.megatron_utils.update_weight import build_weight_sender
    from slime.backends.megatron_utils.update_weight.check import check_engines_match_trainer
    from slime.backends.megatron_utils.weight_export import is_weight_sender, iter_hf_named_tensors

    # Trainer weights from the unquantised checkpoint, engine checkpoint (--hf-checkpoint) FP8.
    args, trainer = build_trainer(plain_dir, world, ["--expert-model-parallel-size", "2",
                                                     "--hf-checkpoint", fp8_dir], rank, port)
    trainer.train(0, fixed_rollout_data())
    trainer.update_weights([urls["fp8"]], "fp8-1")
    sent = [(n, str(t.dtype).removeprefix("torch."), list(t.shape))
            for bucket in trainer._weight_sender.buckets() for n, t in bucket]  # collective
    fp8_diff = check_engines_match_trainer(trainer, [urls["fp8"]], atol=float("inf"))
    # the same weights again through the colocated (tensor) sender
    build_weight_sender(args, trainer.model, [urls["fp8"]], kind="tensor").update_weights("fp8-tensor")
    tensor_diff = check_engines_match_trainer(trainer, [urls["fp8"]], atol=float("inf"))
    named = dict(iter_hf_named_tensors(trainer.model, read_hf_config(plain_dir), args))
    if is_weight_sender():
        save_hf_checkpoint(named.items(), Path(out) / "trained", origin_hf_dir=plain_dir)
        (Path(out) / "sent.json").write_text(json.dumps(sent))
    args.hf_checkpoint = plain_dir  # the same trainer syncing an engine whose checkpoint is not FP8
    trainer.update_weights([urls["plain"]], "plain-1")
    plain_diff = check_engines_match_trainer(trainer, [urls["plain"]], atol=float("inf"))
    if rank == 0:
        (Path(out) / "result.json").write_text(json.dumps({"fp8": fp8_diff, "tensor": tensor_diff, "plain": plain_diff}))
    destroy_parallel()


@pytest.fixture(scope="module")
def synced(engines, tiny_moe_hf, tiny_moe_fp8_hf, tmp_path_factory):
    out = tmp_path_factory.mktemp("fp8_sync")
    spawn_until_exit(_worker, (2, free_port(), str(tiny_moe_hf), str(tiny_moe_fp8_hf), engines, str(out)),
                     nprocs=2)
    return out


def _checkpoint_layout(folder) -> list:
    with safe_open(str(Path(folder) / "model.safetensors"), framework="pt") as f:
        return sorted((n, str(f.get_slice(n).get_dtype()), list(f.get_slice(n).get_shape())) for n in f.keys())


def test_sent_tensors_have_the_fp8_checkpoint_layout(synced, tiny_moe_fp8_hf):
    sent = json.loads((synced / "sent.json").read_text())
    assert len(sent) == len({n for n, _, _ in sent})
    dtype_names = {"float8_e4m3fn": "F8_E4M3", "float32": "F32", "bfloat16": "BF16"}
    assert sorted((n, dtype_names[d], s) for n, d, s in sent) == _checkpoint_layout(tiny_moe_fp8_hf)


def test_fp8_engine_serves_the_quantised_trained_weights(synced, engines, tiny_moe_fp8_hf, tmp_path):
    trained = {k: v for path in sorted((synced / "trained").glob("*.safetensors")) for k, v in load_file(path).items()}
    config = fp8_config_from_hf(json.loads((Path(tiny_moe_fp8_hf) / "config.json").read_text()))
    reference = write_dequantized_copy(tiny_moe_fp8_hf, tmp_path / "ref", dict(quantize_named(trained.items(), config)))
    model = AutoModelForCausalLM.from_pretrained(reference, dtype=torch.float32).eval()
    prompt = probe_prompt(128)
    res = SyncEngineClient(engines["fp8"]).generate({"input_ids": prompt, "return_logprob": True,
                                                     "sampling_params": {"temperature": 0, "max_new_tokens": 8}})
    assert res["meta_info"]["weight_version"] == "fp8-tensor"
    got = torch.tensor([e[0] for e in res["meta_info"]["output_token_logprobs"]])
    torch.testing.assert_close(got, hf_logprobs(model, prompt, res["output_ids"], 0.0), atol=1e-5, rtol=0)


def _logit_spread(folder, prompt: list, output_ids: list) -> float:
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + output_ids])).logits[0, len(prompt) - 1: -1]
    return float((logits.max(-1).values - logits.min(-1).values).max())


def test_fp8_engine_matches_the_trainer_within_the_fp8_bound(synced, engines):
    result = json.loads((synced / "result.json").read_text())
    fp8 = result["fp8"]["check/weight_update_max_abs_logprob_diff"]
    plain = result["plain"]["check/weight_update_max_abs_logprob_diff"]
    prompt = probe_prompt(128)
    out = SyncEngineClient(engines["fp8"]).generate({"input_ids": prompt, "sampling_params": {
        "temperature": 0, "max_new_tokens": 8, "ignore_eos": True}})["output_ids"]
    tol = 2 * 2.0 ** -4 * _logit_spread(synced / "trained", prompt, out)
    assert 1e-4 < fp8 <= tol, (fp8, tol)
    assert result["tensor"] == result["fp8"]  # distributed and tensor senders deliver the same bytes
    assert plain <= 1e-5 and plain * 10 < fp8, (plain, fp8)


def test_unquantised_sync_into_the_fp8_engine_is_refused(synced, engines):
    url = engines["fp8"]
    trained = {k: v for path in sorted((synced / "trained").glob("*.safetensors")) for k, v in load_file(path).items()}
    before = SyncEngineClient(url).get_weight_version()
    sender = UpdateWeightFromDistributed([url], lambda: [sorted(trained.items())])
    sender.connect()
    with pytest.raises(EngineHTTPError) as err:
        sender.update_weights("bf16-into-fp8")
    sender.disconnect()
    SyncEngineClient(url).continue_generation()  # a failed sync leaves the engines paused on purpose
    assert err.value.status == 400 and "is FP8" in err.value.body
    assert SyncEngineClient(url).get_weight_version() == before
