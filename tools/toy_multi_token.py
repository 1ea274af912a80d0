"""Multi-token GRPO steps for tools/check_toy_learnability.py (`--task parity_twice`).

The plain loop of that tool, for responses of several tokens: sample up to `max_len` tokens per
response at temperature 1 (a response ends at the end-of-turn token or is cut at the limit),
score it with the `char_match` reward the framework uses (slime.rollout.rm_hub.char_match, on
the text without special tokens, as with --rollout-skip-special-tokens), advantage (r - group
mean) / (group std + 1e-6), loss = -(advantage * token log-prob) - entropy_coef * entropy,
averaged over each response's tokens and then over the samples (the framework's reduction
without --calculate-per-token-loss), one Adam step per rollout with the gradient clipped.
"""

from __future__ import annotations

import torch

from slime.rollout.rm_hub.char_match import char_match_score


def _by_length(items: list, key) -> dict:
    groups = {}
    for i, item in enumerate(items):
        groups.setdefault(key(item), []).append(i)
    return groups


@torch.no_grad()
def sample_responses(model, prompts: list[list[int]], max_len: int, eot: int, gen=None) -> list[list[int]]:
    """One response per prompt: sampled (greedy when `gen` is None) until `eot` or `max_len` tokens."""
    out = [None] * len(prompts)
    for idx in _by_length(prompts, len).values():
        x = torch.tensor([prompts[i] for i in idx])
        responses, done = [[] for _ in idx], [False] * len(idx)
        for _ in range(max_len):
            logits = model(x).logits[:, -1].float()
            nxt = logits.argmax(-1) if gen is None else torch.multinomial(logits.softmax(-1), 1, generator=gen)[:, 0]
            for j, token in enumerate(nxt.tolist()):
                if not done[j]:
                    responses[j].append(token)
                    done[j] = token == eot
            if all(done):
                break
            x = torch.cat([x, nxt[:, None]], dim=1)
        for j, i in enumerate(idx):
            out[i] = responses[j]
    return out


def score(tokenizer, response: list[int], label: str, eot: int) -> float:
    """char_match of one response: stopped iff it ends with `eot`; the answer's tokens counted."""
    stopped = bool(response) and response[-1] == eot
    answer = response[:-1] if stopped else response
    return char_match_score(tokenizer.decode(answer, skip_special_tokens=True), label, stopped, len(answer))


def _loss(model, prompts, responses, advantages, entropy_coef: float) -> torch.Tensor:
    """Sum over samples of the per-response mean of -(A * log p) - entropy_coef * H, / samples."""
    total = 0.0
    for idx in _by_length(range(len(prompts)), lambda i: (len(prompts[i]), len(responses[i]))).values():
        start, length = len(prompts[idx[0]]), len(responses[idx[0]])
        x = torch.tensor([prompts[i] + responses[i] for i in idx])
        logp = model(x).logits[:, start - 1:start - 1 + length].float().log_softmax(-1)
        token_logp = logp.gather(2, x[:, start:, None])[..., 0]
        entropy = -(logp.exp() * logp).sum(-1)
        adv = torch.tensor([advantages[i] for i in idx])[:, None]
        total = total + (-(adv * token_logp) - entropy_coef * entropy).mean(1).sum()
    return total / len(prompts)


def grpo_step(model, optimizer, tokenizer, prompts, labels, n_samples: int, gen, *, max_len: int,
              entropy_coef: float, clip_grad: float = 1.0) -> tuple[float, float]:
    """One on-policy GRPO update; return (mean reward, fraction of responses cut at the limit)."""
    eot = tokenizer.convert_tokens_to_ids("<|im_end|>")
    expanded = [p for p in prompts for _ in range(n_samples)]
    model.eval()
    responses = sample_responses(model, expanded, max_len, eot, gen)
    model.train()
    rewards = torch.tensor([score(tokenizer, r, labels[i // n_samples], eot) for i, r in enumerate(responses)])
    grouped = rewards.view(len(prompts), n_samples)
    adv = ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-6)).flatten()
    optimizer.zero_grad()
    _loss(model, expanded, responses, adv.tolist(), entropy_coef).backward()
    if clip_grad > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip_grad)
    optimizer.step()
    cut = sum(not r or r[-1] != eot for r in responses) / len(responses)
    return rewards.mean().item(), cut


def greedy_score(model, tokenizer, prompts, labels, max_len: int) -> float:
    """Mean char_match of the greedy responses."""
    eot = tokenizer.convert_tokens_to_ids("<|im_end|>")
    model.eval()
    responses = sample_responses(model, prompts, max_len, eot)
    return sum(score(tokenizer, r, label, eot) for r, label in zip(responses, labels)) / len(prompts)
