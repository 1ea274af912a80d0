"""slime's SFT "rollout": no generation, the data's conversations become training samples.

Use as slime's SFT recipes do:

    --rollout-function-path slime.rollout.sft_rollout.generate_rollout --input-key messages
    --loss-type sft_loss --disable-compute-advantages-and-returns --loss-mask-type qwen
    [--calculate-per-token-loss] [--debug-train-only: no engines]

Each prompt row's messages are tokenized with the tokenizer's chat template
(`slime.utils.loss_mask`); the sample's response is everything from the first assistant token to
the end, its loss mask 1 on the assistant turns only, its reward 0 (SFT needs none).
"""

from __future__ import annotations

import logging

from slime.utils.data import load_tokenizer
from slime.utils.loss_mask import response_length, tokens_and_loss_mask
from slime.utils.types import Sample

logger = logging.getLogger(__name__)


def sft_sample(sample: Sample, tokenizer, mask_type: str) -> Sample:
    """Fill `sample` (prompt = messages; tools from metadata["tools"]) as an SFT training sample."""
    tools = (sample.metadata or {}).get("tools")
    tokens, mask = tokens_and_loss_mask(tokenizer, sample.prompt, mask_type, tools=tools)
    length = response_length(mask)
    sample.tokens = tokens
    sample.response_length = length
    sample.loss_mask = mask[-length:]
    sample.reward = 0
    sample.status = Sample.Status.COMPLETED
    return sample


def generate_rollout(args, rollout_id: int, data_source, evaluation: bool = False) -> list[list[Sample]]:
    """`--rollout-batch-size` groups of the data source, each sample tokenized for SFT."""
    if evaluation:
        raise ValueError("slime.rollout.sft_rollout.generate_rollout has no evaluation mode: give "
                         "--eval-function-path a generating rollout function (or drop --eval-interval)")
    tokenizer = load_tokenizer(args.hf_checkpoint)
    groups = data_source.get_samples(args.rollout_batch_size)
    for group in groups:
        for sample in group:
            sft_sample(sample, tokenizer, args.loss_mask_type)
    logger.info("rollout %d: %d SFT samples", rollout_id, sum(len(g) for g in groups))
    return groups
