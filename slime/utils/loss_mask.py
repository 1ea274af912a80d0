"""SFT loss masks from the tokenizer's chat template: train on the assistant turns only.

slime's `MultiTurnLossMaskGenerator` (`--loss-mask-type qwen | qwen3 | distill_qwen`) tokenizes a
conversation and marks the tokens of every assistant turn (its content and end-of-turn marker, not
the role header that opens it). Here the spans come from the template itself: assistant turn i
spans from the end of the rendering of messages[:i] with the generation prompt (everything up to
the assistant header) to the end of the rendering of messages[:i+1]. Both renderings must be
prefixes of the whole conversation's rendering; a template that renders a turn differently once
later turns follow (e.g. one that drops the reasoning of earlier turns) is refused naming the turn.
The type names the template family, checked against the template's markers.
"""

from __future__ import annotations

from typing import Any

# --loss-mask-type -> (template family, a marker of its assistant header in the rendered text)
MASK_TYPE_MARKERS = {
    "qwen": ("ChatML (Qwen2.5)", "<|im_start|>assistant"),
    "qwen3": ("ChatML (Qwen3)", "<|im_start|>assistant"),
    "distill_qwen": ("DeepSeek-R1-Distill-Qwen", "<｜Assistant｜>"),
}


def _render(tokenizer, messages: list[dict], generation_prompt: bool, extra: dict) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt, **extra)


def _prefix(text: str, full: str, what: str, mask_type: str) -> int:
    if not full.startswith(text):
        raise ValueError(f"--loss-mask-type {mask_type}: the chat template renders {what} differently once later "
                         "turns follow (it rewrites earlier turns); train such conversations one assistant turn "
                         "per sample")
    return len(text)


def assistant_char_spans(tokenizer, messages: list[dict], mask_type: str, tools: Any = None) -> tuple[str, list]:
    """(the conversation's rendered text, [(start, end) character span of each assistant turn])."""
    if mask_type not in MASK_TYPE_MARKERS:
        raise ValueError(f"--loss-mask-type {mask_type!r} is not one of {sorted(MASK_TYPE_MARKERS)}")
    if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m for m in messages):
        raise ValueError(f"--loss-mask-type {mask_type}: the SFT sample's prompt must be a list of "
                         f"{{'role', 'content'}} messages (--input-key), got {type(messages).__name__}")
    extra = {"tools": tools} if tools is not None else {}
    full = _render(tokenizer, messages, False, extra)
    family, marker = MASK_TYPE_MARKERS[mask_type]
    spans = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        head = _render(tokenizer, messages[:i], True, extra)
        opening = head[len(_render(tokenizer, messages[:i], False, extra)):] if i else head
        if marker not in opening:
            raise ValueError(f"--loss-mask-type {mask_type} expects a {family} chat template (assistant header "
                             f"{marker!r}); this tokenizer's template opens the assistant turn with "
                             f"{opening!r}: pick the matching --loss-mask-type")
        start = _prefix(head, full, f"the prompt of assistant turn {i}", mask_type)
        end = _prefix(_render(tokenizer, messages[:i + 1], False, extra), full, f"assistant turn {i}", mask_type)
        spans.append((start, end))
    if not spans:
        raise ValueError(f"--loss-mask-type {mask_type}: the conversation has no assistant message to train on")
    return full, spans


def tokens_and_loss_mask(tokenizer, messages: list[dict], mask_type: str, tools: Any = None) -> tuple[list, list]:
    """(token ids of the whole conversation, 0/1 mask: 1 on the tokens of the assistant turns).
    A token counts when it starts inside a span (needs a fast tokenizer's offsets)."""
    full, spans = assistant_char_spans(tokenizer, messages, mask_type, tools)
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError(f"--loss-mask-type {mask_type}: the tokenizer has no character offsets (not a fast "
                         "tokenizer); the loss mask needs them")
    encoded = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    mask = [int(any(s <= start < e for s, e in spans)) for start, _ in encoded["offset_mapping"]]
    return list(encoded["input_ids"]), mask


def response_length(loss_mask: list[int]) -> int:
    """Tokens from the first trained token to the end (slime's `get_response_lengths`): the part
    of the sample the trainer computes log-probs for; the prompt before it is context only."""
    if 1 not in loss_mask:
        raise ValueError("the loss mask marks no token")
    return len(loss_mask) - loss_mask.index(1)
