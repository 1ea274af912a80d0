"""SFT loss masks from the chat template (`--loss-mask-type`) and slime's SFT rollout function."""

from types import SimpleNamespace

import pytest

from slime.utils.loss_mask import response_length, tokens_and_loss_mask
from slime.utils.types import Sample

CONVERSATION = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "1+1"},
    {"role": "assistant", "content": "2"},
    {"role": "user", "content": "2+2"},
    {"role": "assistant", "content": "4"},
]


@pytest.fixture(scope="module")
def tokenizer(tiny_dense_hf):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_dense_hf))  # our own copy: tests change its template


def _trained_text(tokenizer, tokens, mask):
    return tokenizer.decode([t for t, m in zip(tokens, mask) if m])


@pytest.mark.parametrize("mask_type", ["qwen", "qwen3"])
def test_mask_marks_assistant_turns_only(tokenizer, mask_type):
    tokens, mask = tokens_and_loss_mask(tokenizer, CONVERSATION, mask_type)
    text = tokenizer.apply_chat_template(CONVERSATION, tokenize=False)
    assert tokens == tokenizer(text, add_special_tokens=False)["input_ids"] and len(mask) == len(tokens)
    # content and end-of-turn of both assistant turns; no role header, no user or system text
    assert _trained_text(tokenizer, tokens, mask) == "2<|im_end|>\n4<|im_end|>\n"
    length = response_length(mask)
    assert tokenizer.decode(tokens[-length:]).startswith("2<|im_end|>\n<|im_start|>user\n2+2")


def test_mask_type_must_match_the_template_family(tokenizer):
    with pytest.raises(ValueError, match="--loss-mask-type distill_qwen expects a DeepSeek-R1-Distill-Qwen"):
        tokens_and_loss_mask(tokenizer, CONVERSATION, "distill_qwen")


def test_template_that_rewrites_earlier_turns_is_refused(tokenizer, monkeypatch):
    """A template dropping earlier assistant turns' text (as reasoning is dropped) cannot be masked
    turn by turn: refused, naming the turn."""
    rewriting = ("{%- for m in messages %}<|im_start|>{{ m['role'] }}\n"
                 "{%- if m['role'] != 'assistant' or loop.last %}{{ m['content'] }}{%- endif %}<|im_end|>\n"
                 "{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}")
    monkeypatch.setattr(tokenizer, "chat_template", rewriting)
    with pytest.raises(ValueError, match="renders assistant turn 2 differently once later turns follow"):
        tokens_and_loss_mask(tokenizer, CONVERSATION, "qwen")


@pytest.mark.parametrize("messages, message", [
    ([{"role": "user", "content": "hi"}], "no assistant message"),
    ("just text", "must be a list of"),
])
def test_bad_conversations_are_named(tokenizer, messages, message):
    with pytest.raises(ValueError, match=message):
        tokens_and_loss_mask(tokenizer, messages, "qwen")


def test_sft_rollout_turns_rows_into_training_samples(tiny_dense_hf):
    from slime.rollout.sft_rollout import generate_rollout
    from slime.rollout.train_data import samples_to_train_data

    class Source:
        def get_samples(self, n):
            return [[Sample(index=i, prompt=list(CONVERSATION[1:3]))] for i in range(n)]

    args = SimpleNamespace(hf_checkpoint=str(tiny_dense_hf), rollout_batch_size=2, loss_mask_type="qwen",
                           advantage_estimator="grpo", n_samples_per_prompt=1, disable_rewards_normalization=True,
                           disable_grpo_std_normalization=False, reward_key=None)
    groups = generate_rollout(args, 0, Source())
    sample = groups[1][0]
    assert sample.response_length == 3 and sample.loss_mask == [1, 1, 1]  # "2", "<|im_end|>", "\n"
    assert sample.status == Sample.Status.COMPLETED and sample.reward == 0
    data = samples_to_train_data(args, [s for g in groups for s in g])
    assert data["loss_masks"] == [[1, 1, 1]] * 2 and data["response_lengths"] == [3, 3]
    with pytest.raises(ValueError, match="no evaluation mode"):
        generate_rollout(args, 0, Source(), evaluation=True)
