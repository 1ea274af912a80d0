"""Quick check that the tiny MoE learns a toy task with GRPO, outside the framework.

Owns a minimal on-policy GRPO loop in plain transformers (no Megatron, no engine): sample
`--n-samples` one-token responses per prompt at temperature 1, reward 1 for the exact label,
advantage (r - group mean) / (group std + 1e-6), loss = -(advantage * logprob) averaged, one Adam
step per rollout. It prints one line per step and a summary (steps and seconds to reach mean
reward >= `--target`, held-out greedy accuracy), so the task and model sizes can be re-tuned.
`--task parity_twice` runs the multi-token task instead (tools/toy_multi_token.py: responses of up
to `--max-len` tokens, the `char_match` reward, `--entropy-coef`; the held-out score is the greedy
responses' mean char_match), as `TASK=parity_twice bash scripts/run-tiny-moe-cpu.sh` trains it.

Usage: python tools/check_toy_learnability.py [--steps 100] [--lr 2e-3] [--seed 0]
       python tools/check_toy_learnability.py --task parity_twice --steps 200 --entropy-coef 0.03
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


def chat_prompt_ids(tokenizer, rows: list[dict]) -> list[list[int]]:
    """Token ids of each row's prompt as a user turn, with the chat template's generation prompt."""
    ids = []
    for row in rows:
        msgs = [{"role": "user", "content": row["prompt"]}]
        text = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        ids.append(tokenizer(text)["input_ids"])
    return ids


def encode_prompts(tokenizer, rows: list[dict]):
    """Return (list of prompt-id tensors, label token ids) with the chat template applied."""
    import torch

    prompts = [torch.tensor(ids) for ids in chat_prompt_ids(tokenizer, rows)]
    return prompts, torch.tensor([tokenizer.convert_tokens_to_ids(row["label"]) for row in rows])


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


def _one_token_task(tokenizer, evals: list[dict], opts):
    """step(model, optimizer, rows, gen) -> (mean reward, greedy eval accuracy), one-token responses."""
    held_out = encode_prompts(tokenizer, evals)

    def step(model, optimizer, rows, gen):
        prompts, labels = encode_prompts(tokenizer, rows)
        reward = grpo_step(model, optimizer, prompts, labels, opts.n_samples, gen, opts.clip_grad)
        return reward, greedy_accuracy(model, *held_out)

    return step


def _multi_token_task(tokenizer, evals: list[dict], opts):
    """step(model, optimizer, rows, gen) -> (mean reward, greedy eval char_match), multi-token responses."""
    multi = _load_tool("toy_multi_token")
    held_out = chat_prompt_ids(tokenizer, evals), [str(row["label"]) for row in evals]

    def step(model, optimizer, rows, gen):
        labels = [str(row["label"]) for row in rows]
        reward, _cut = multi.grpo_step(model, optimizer, tokenizer, chat_prompt_ids(tokenizer, rows), labels,
                                       opts.n_samples, gen, max_len=opts.max_len, entropy_coef=opts.entropy_coef,
                                       clip_grad=opts.clip_grad)
        return reward, multi.greedy_score(model, tokenizer, *held_out, opts.max_len)

    return step


# task -> (tokenizer, eval rows, options) -> one GRPO step returning (mean reward, held-out score)
TASKS = {"parity": _one_token_task, "parity_twice": _multi_token_task}


def run(opts) -> dict:
    """Train the tiny MoE on `opts.task`; return a summary dict (see module docstring)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(opts.seed)
    work = Path(tempfile.mkdtemp(prefix="toy_learnability_"))
    hf = _load_tool("make_tiny_model").make_tiny_model(work / "hf", variant="moe", seed=opts.seed)
    data = _load_tool("make_toy_data").make_toy_data(work / "data", seed=opts.seed, num_train=opts.batch * opts.steps,
                                                      task=opts.task)
    tokenizer = AutoTokenizer.from_pretrained(hf)
    model = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32)
    train = [json.loads(x) for x in (data / "train.jsonl").read_text().splitlines()]
    evals = [json.loads(x) for x in (data / "eval.jsonl").read_text().splitlines()]
    optimizer = torch.optim.Adam(model.parameters(), lr=opts.lr, betas=(0.9, 0.98))
    gen = torch.Generator().manual_seed(opts.seed)
    step_fn = TASKS[opts.task](tokenizer, evals, opts)
    summary = {"task": opts.task, "start_reward": None, "steps_to_target": None, "seconds_to_target": None}
    t0 = time.perf_counter()
    for step in range(opts.steps):
        rows = train[step * opts.batch:(step + 1) * opts.batch]
        reward, held_out = step_fn(model, optimizer, rows, gen)
        summary["start_reward"] = reward if step == 0 else summary["start_reward"]
        logger.info("step %3d  reward %.3f  eval_greedy %.3f", step, reward, held_out)
        if reward >= opts.target and summary["steps_to_target"] is None:
            summary.update(steps_to_target=step, seconds_to_target=round(time.perf_counter() - t0, 1))
    summary["final_eval_greedy"] = held_out
    summary["final_train_reward"] = reward
    return summary


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", default="parity", choices=sorted(TASKS), help="toy task (tools/make_toy_data.py)")
    parser.add_argument("--steps", type=int, default=100, help="GRPO steps (one rollout each)")
    parser.add_argument("--lr", type=float, default=2e-3, help="Adam learning rate")
    parser.add_argument("--seed", type=int, default=0, help="seed of model, data and sampling")
    parser.add_argument("--batch", type=int, default=32, help="prompts per step")
    parser.add_argument("--n-samples", type=int, default=8, help="samples per prompt (GRPO group)")
    parser.add_argument("--target", type=float, default=0.9, help="mean reward to report time to")
    parser.add_argument("--clip-grad", type=float, default=1.0, help="global grad-norm clip (Megatron's default); 0: off")
    parser.add_argument("--max-len", type=int, default=3, help="parity_twice: response token limit")
    parser.add_argument("--entropy-coef", type=float, default=0.03, help="parity_twice: entropy bonus")
    return parser.parse_args(argv)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logger.info("%s", json.dumps(run(parse_args())))
