"""tools/toy_multi_token.py, the plain multi-token GRPO loop of check_toy_learnability.py: responses
end at the end-of-turn token or the limit, the reward is char_match's, a step moves the policy
towards the better-scored responses (no timing, no learning curve asserted)."""

import pytest
import torch

from tests.conftest import load_tool

multi = load_tool("toy_multi_token")
toy = load_tool("check_toy_learnability")
ROWS = [{"prompt": "12 mod 2 twice", "label": "00"}, {"prompt": "7 mod 2 twice", "label": "11"}]


@pytest.fixture
def model_and_tokenizer(tiny_moe_hf):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(tiny_moe_hf, dtype=torch.float32), AutoTokenizer.from_pretrained(tiny_moe_hf)


def test_responses_end_at_the_end_of_turn_or_the_limit(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    eot = tokenizer.convert_tokens_to_ids("<|im_end|>")
    prompts = toy.chat_prompt_ids(tokenizer, ROWS * 32)
    responses = multi.sample_responses(model, prompts, 3, eot, torch.Generator().manual_seed(0))
    for r in responses:
        assert 1 <= len(r) <= 3 and eot not in r[:-1]
        assert r[-1] == eot or len(r) == 3
    greedy = multi.sample_responses(model, prompts[:2], 3, eot)
    assert greedy == multi.sample_responses(model, prompts[:2], 3, eot)  # deterministic


def test_score_is_char_match_on_the_text_without_the_end_of_turn(model_and_tokenizer):
    _, tokenizer = model_and_tokenizer
    eot = tokenizer.convert_tokens_to_ids("<|im_end|>")
    one, zero = tokenizer.convert_tokens_to_ids("1"), tokenizer.convert_tokens_to_ids("0")
    assert multi.score(tokenizer, [one, one, eot], "11", eot) == 1.0
    assert multi.score(tokenizer, [zero, zero, eot], "11", eot) == pytest.approx(1 / 3)  # the stop's share
    assert multi.score(tokenizer, [one, one, one], "11", eot) == 0.0  # cut at the limit
    assert multi.score(tokenizer, [one, eot], "11", eot) == pytest.approx(1 / 3)  # one right character, early stop


def test_a_step_raises_the_better_responses_probability(model_and_tokenizer, monkeypatch):
    """With the sampled responses fixed to one right and one wrong answer per group, one step makes
    the right one more likely and the wrong one less."""
    model, tokenizer = model_and_tokenizer
    eot = tokenizer.convert_tokens_to_ids("<|im_end|>")
    right, wrong = [tokenizer.convert_tokens_to_ids("0")] * 2 + [eot], [tokenizer.convert_tokens_to_ids("1")] * 2 + [eot]
    prompts, labels = toy.chat_prompt_ids(tokenizer, ROWS[:1]), [ROWS[0]["label"]]
    monkeypatch.setattr(multi, "sample_responses", lambda *a, **k: [right, wrong])

    def logp(response):
        with torch.no_grad():
            x = torch.tensor([prompts[0] + response])
            out = model(x).logits[0, len(prompts[0]) - 1:-1].log_softmax(-1)
            return out.gather(1, x[0, len(prompts[0]):, None]).sum().item()

    before = logp(right), logp(wrong)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    reward, cut = multi.grpo_step(model, opt, tokenizer, prompts, labels, 2, None, max_len=3, entropy_coef=0.0)
    assert reward == pytest.approx((1 + 1 / 3) / 2) and cut == 0.0
    assert logp(right) > before[0] and logp(wrong) < before[1]
