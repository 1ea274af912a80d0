"""slime's `mask_utils.MultiTurnLossMaskGenerator` import path, over `slime.utils.loss_mask`.

`MultiTurnLossMaskGenerator(tokenizer, tokenizer_type="qwen")` with `get_loss_mask(messages,
tools=None) -> (token_ids, loss_mask)`: the loss mask is 1 on the tokens of every assistant turn
(content and end-of-turn marker). The spans come from the tokenizer's chat template
(`loss_mask.assistant_char_spans`); `tokenizer_type` is a `--loss-mask-type` and is checked
against the template's assistant header.
"""

from __future__ import annotations

from typing import Any

from slime.utils.loss_mask import MASK_TYPE_MARKERS, response_length, tokens_and_loss_mask


class MultiTurnLossMaskGenerator:
    """Token ids and assistant-turn loss masks of chat conversations for one tokenizer."""

    def __init__(self, tokenizer, tokenizer_type: str = "qwen") -> None:
        if tokenizer_type not in MASK_TYPE_MARKERS:
            raise ValueError(f"tokenizer_type {tokenizer_type!r} is unknown; choices: {sorted(MASK_TYPE_MARKERS)} "
                             "(the --loss-mask-type values)")
        self.tokenizer, self.tokenizer_type = tokenizer, tokenizer_type

    def get_loss_mask(self, messages: list[dict], tools: Any = None) -> tuple[list[int], list[int]]:
        """(token ids of the whole conversation, 0/1 loss mask of the same length)."""
        return tokens_and_loss_mask(self.tokenizer, messages, self.tokenizer_type, tools)

    @staticmethod
    def get_response_lengths(loss_masks: list[list[int]]) -> list[int]:
        """Per mask, the tokens from the first trained one to the end."""
        return [response_length(mask) for mask in loss_masks]
