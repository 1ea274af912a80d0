"""Quick check that the tiny MoE learns the toy task with GRPO, outside the framework.

Owns a minimal on-policy GRPO loop in plain transformers (no Megatron, no engine): sample
`--n-samples` one-token responses per prompt at temperature 1, reward 1 for the exact label,
advantage (r - group mean) / (group std + 1e-6), loss = -(advantage * logprob) averaged, one Adam
step per rollout. It prints one line per step and a summary (steps and seconds to reach mean
reward >= `--target`, held-out greedy accuracy), so the task and model sizes can be re-tuned.

Usage: python tools/check_toy_learnability.py [--steps 100] [--lr 2e-3] [--seed 0]
"""

import argparse
import json
import logging
import tempfile
import time
from pathlib import Path

logger = logging.getLogger(__name__)


def _load_tool(name: str):
    """Import a sibling tool module by file path (tools/ is not a package)."""
    import importlib.util

    path = Path(__file__).resolve().parent / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"slime_tools_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def encode_prompts(tokenizer, rows: list[dict]):
    """Return (list of prompt-id tensors, label token ids) with the chat template applied."""
    import torch

    prompts, labels = [], []
    for row in rows:
        msgs = [{"role": "user", "content": row["prompt"]}]
        text = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        prompts.append(torch.tensor(tokenizer(text)["input_ids"]))
        labels.append(tokenizer.convert_tokens_to_ids(row["label"]))
    return prompts, torch.tensor(labels)


def next_token_logprobs(model, prompts):
    """Return [len(prompts), vocab] log-probabilities of the next token, batching equal lengths."""
    import torch

    out = [None] * len(prompts)
    by_len = {}
    for i, p in enumerate(prompts):
        by_len.setdefault(len(p), []).append(i)
    for idx in by_len.values():
        logits = model(torch.stack([prompts[i] for i in idx])).logits[:, -1].float()
        for j, i in enumerate(idx):
            out[i] = logits[j].log_softmax(-1)
    return torch.stack(out)


def grpo_step(model, optimizer, prompts, labels, n_samples: int, gen, clip_grad: float = 1.0) -> float:
    """One on-policy GRPO update on one-token responses; return the mean reward before it.

    Gradients are clipped to global norm `clip_grad` (0: off), as Megatron does (--clip-grad 1.0).
    """
    import torch

    logp = next_token_logprobs(model, prompts)  # [B, V]
    samples = torch.multinomial(logp.detach().exp(), n_samples, replacement=True, generator=gen)  # [B, n]
    rewards = (samples == labels[:, None]).float()
    adv = (rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-6)
    loss = -(adv * logp.gather(1, samples)).mean()
    optimizer.zero_grad()
    loss.backward()
    if clip_grad > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip_grad)
    optimizer.step()
    return rewards.mean().item()


def greedy_accuracy(model, prompts, labels) -> float:
    """Fraction of prompts whose argmax next token is the label."""
    import torch

    with torch.no_grad():
        return (next_token_logprobs(model, prompts).argmax(-1) == labels).float().mean().item()


def run(steps: int, lr: float, seed: int, batch: int, n_samples: int, target: float, clip_grad: float) -> dict:
    """Train the tiny MoE on the toy task; return a summary dict (see module docstring)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)
    work = Path(tempfile.mkdtemp(prefix="toy_learnability_"))
    hf = _load_tool("make_tiny_model").make_tiny_model(work / "hf", variant="moe", seed=seed)
    data = _load_tool("make_toy_data").make_toy_data(work / "data", seed=seed, num_train=batch * steps)
    tokenizer = AutoTokenizer.from_pretrained(hf)
    model = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32)
    train = [json.loads(x) for x in (data / "train.jsonl").read_text().splitlines()]
    evals = encode_prompts(tokenizer, [json.loads(x) for x in (data / "eval.jsonl").read_text().splitlines()])
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, betas=(0.9, 0.98))
    gen = torch.Generator().manual_seed(seed)
    summary = {"start_reward": None, "steps_to_target": None, "seconds_to_target": None}
    t0 = time.perf_counter()
    for step in range(steps):
        prompts, labels = encode_prompts(tokenizer, train[step * batch:(step + 1) * batch])
        reward = grpo_step(model, optimizer, prompts, labels, n_samples, gen, clip_grad)
        summary["start_reward"] = reward if step == 0 else summary["start_reward"]
        logger.info("step %3d  reward %.3f  eval_greedy %.3f", step, reward, greedy_accuracy(model, *evals))
        if reward >= target and summary["steps_to_target"] is None:
            summary.update(steps_to_target=step, seconds_to_target=round(time.perf_counter() - t0, 1))
    summary["final_eval_greedy_accuracy"] = greedy_accuracy(model, *evals)
    summary["final_train_reward"] = reward
    return summary


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=100, help="GRPO steps (one rollout each)")
    parser.add_argument("--lr", type=float, default=2e-3, help="Adam learning rate")
    parser.add_argument("--seed", type=int, default=0, help="seed of model, data and sampling")
    parser.add_argument("--batch", type=int, default=32, help="prompts per step")
    parser.add_argument("--n-samples", type=int, default=8, help="samples per prompt (GRPO group)")
    parser.add_argument("--target", type=float, default=0.9, help="mean reward to report time to")
    parser.add_argument("--clip-grad", type=float, default=1.0, help="global grad-norm clip (Megatron's default); 0: off")
    cli = parser.parse_args()
    logger.info("%s", json.dumps(run(cli.steps, cli.lr, cli.seed, cli.batch, cli.n_samples, cli.target, cli.clip_grad)))
