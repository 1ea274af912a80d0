"""--check-weight-update-equal: after a sync, do the engines compute what the trainer computes?

Owns `check_engines_match_trainer`. Engines expose no way to read weights back, so the check is
behavioural: every engine continues a fixed probe prompt (greedy, or seeded sampling at
--rollout-temperature when that is not 1) with `return_logprob`, and the trainer computes the
log-probs of the same tokens by teacher forcing. In fp32 they agree within 1e-5 when the weights
match; a missed or misnamed tensor moves them by far more. The same probe, tokens and tolerance
on every rank; the result (max abs difference) is identical on every rank.
"""

from __future__ import annotations

import logging

import torch
import torch.distributed as dist

from slime.backends.megatron_utils import collectives
from slime.backends.megatron_utils.update_weight.common import run_on_engines
from slime.utils import engine_requests

logger = logging.getLogger(__name__)


def probe_prompt(vocab_size: int, length: int = 8) -> list[int]:
    """A fixed prompt of `length` token ids spread over the vocabulary."""
    return [(37 * i + 11) % vocab_size for i in range(length)]


def _engine_continuations(urls: list[str], prompt: list[int], max_new_tokens: int, temperature: float) -> list:
    """[(output ids, output log-probs)] per engine."""
    sampling = {"max_new_tokens": max_new_tokens, "ignore_eos": True,
                "temperature": 0.0 if temperature == 1.0 else temperature}
    if temperature != 1.0:
        sampling["sampling_seed"] = 1234

    async def one(client, _i):
        out = await client.generate(engine_requests.generate(prompt, sampling, return_logprob=True))
        logprobs = [float(entry[0]) for entry in out["meta_info"]["output_token_logprobs"]]
        return list(out["output_ids"]), logprobs

    return run_on_engines(urls, one)


def check_engines_match_trainer(trainer, engine_urls: list[str], max_new_tokens: int = 8,
                                atol: float = 1e-5) -> dict[str, float]:
    """Compare every engine's log-probs on the probe with the trainer's; collective.

    `trainer` is a `MegatronTrainer` (its `args` give --vocab-size or --hf-checkpoint's config).
    Raises ValueError naming the engine when the largest difference exceeds `atol`; returns
    {"check/weight_update_max_abs_logprob_diff": value}.
    """
    vocab_size = trainer.args.vocab_size
    if vocab_size is None:
        from slime.backends.megatron_utils.hf_io import read_hf_config

        vocab_size = int(read_hf_config(trainer.args.hf_checkpoint)["vocab_size"])
    prompt = probe_prompt(vocab_size)
    box = [None]
    if dist.get_rank() == 0:
        box[0] = _engine_continuations(engine_urls, prompt, max_new_tokens, trainer.args.rollout_temperature)
    outputs = collectives.broadcast_object_list(box, src=0)[0]
    data = {"tokens": [prompt + ids for ids, _ in outputs], "response_lengths": [len(ids) for ids, _ in outputs],
            "loss_masks": [[1] * len(ids) for ids, _ in outputs]}
    got = trainer.compute_log_prob(data, list(range(len(outputs))))
    diffs = torch.zeros(len(outputs), dtype=torch.float64)
    if got is not None:  # last pipeline stage
        for i, (_, engine_lp) in enumerate(outputs):
            mine = got["log_probs"][i].double().cpu()
            diffs[i] = (mine - torch.tensor(engine_lp, dtype=torch.float64)).abs().max()
    diffs = collectives.all_reduce(collectives.to_device(diffs), "max").cpu()
    worst = int(diffs.argmax())
    if float(diffs[worst]) > atol:
        raise ValueError(f"--check-weight-update-equal: engine {engine_urls[worst]} log-probs differ from the "
                         f"trainer's by {float(diffs[worst]):.3g} (> {atol}) on the probe prompt")
    logger.info("weight update check: engines match the trainer within %.3g", float(diffs.max()))
    return {"check/weight_update_max_abs_logprob_diff": float(diffs.max())}
