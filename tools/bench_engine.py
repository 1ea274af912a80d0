"""Benchmark the local engine against same-run baselines (ratios; absolute times here are noise).

1. Decode throughput: useful tokens/s of the engine over HTTP (one concurrent request per sequence,
   continuous batching) vs transformers `generate` on the same left-padded batch (static batching:
   it runs until the longest response is done). Scenarios with equal and with varied response
   lengths; useful tokens = the sum of the requested lengths in both cases (greedy, EOS ignored).
   Each scenario runs `--repeats` times, engine and baseline interleaved; medians are reported.
   Next to wall time, CPU time: the engine process's (all its threads, from /proc schedstat) and
   this process's during `generate`; their ratio moves much less than wall time when other
   processes share the cores.
2. Weight sync: seconds per GB of `/update_weights_from_distributed` (HTTP + gloo broadcast +
   loading into the model) vs a raw gloo broadcast of the same tensors to a plain receiver process.

Usage: python tools/bench_engine.py [--model-path DIR] [--batch 16] [--skip-sync] [--out bench_engine.json]
Decode runs on the tiny Qwen3-MoE of tools/make_tiny_model.py (or --model-path) and on a wider
dense Qwen3 (--sync-hidden, --sync-layers), which is also the weight-sync payload (not trivial).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

from slime.utils.misc import free_port

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model-path", default=None, help="HF checkpoint to serve (default: the tiny MoE)")
    p.add_argument("--batch", type=int, default=16, help="sequences per decode scenario")
    p.add_argument("--prompt-len", type=int, default=16, help="prompt tokens per sequence")
    p.add_argument("--max-response-len", type=int, default=128, help="longest response in the scenarios")
    p.add_argument("--repeats", type=int, default=3, help="runs per decode scenario (interleaved; medians)")
    p.add_argument("--num-threads", type=int, default=1, help="torch threads for the engine and the baseline")
    p.add_argument("--sync-hidden", type=int, default=512, help="hidden size of the dense sync-benchmark model")
    p.add_argument("--sync-layers", type=int, default=4, help="layers of the dense sync-benchmark model")
    p.add_argument("--sync-rounds", type=int, default=5, help="weight-sync repetitions (best is reported)")
    p.add_argument("--skip-sync", action="store_true", help="decode scenarios only (no weight-sync benchmark)")
    p.add_argument("--out", default="bench_engine.json", help="JSON output path")
    return p.parse_args()


def _load_tool(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", REPO / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_sync_model(tiny_dir: Path, out: Path, hidden: int, layers: int) -> Path:
    """A randomly initialised dense Qwen3 of the given width/depth with the tiny tokenizer."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(_load_tool("make_tiny_model").make_tiny_model(out / "dense_base", "dense"))
    config.update({"hidden_size": hidden, "intermediate_size": 3 * hidden, "num_hidden_layers": layers,
                   "num_attention_heads": hidden // 64, "num_key_value_heads": max(1, hidden // 128), "head_dim": 64,
                   "max_window_layers": layers, "layer_types": ["full_attention"] * layers})
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(out / "sync_model")
    for f in tiny_dir.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")):
            (out / "sync_model" / f.name).write_bytes(f.read_bytes())
    return out / "sync_model"


def scenarios(batch: int, max_len: int) -> dict[str, list[int]]:
    """Response lengths per sequence: all equal, and spread from max_len/16 to max_len."""
    varied = [max(1, int(max_len * (1 + 15 * i / max(1, batch - 1)) / 16)) for i in range(batch)]
    return {"equal": [max_len] * batch, "varied": varied}


def _process_cpu_s(pid: int) -> float:
    """CPU seconds all threads of process `pid` have run (Linux /proc schedstat, nanoseconds)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (FileNotFoundError, ProcessLookupError):  # a thread that just ended
            pass
    return total / 1e9


async def _engine_run(url: str, prompts: list[list[int]], lens: list[int], pid: int) -> tuple[float, int, float]:
    from slime.utils.engine_client import EngineClient

    async with EngineClient(url) as client:
        cpu = _process_cpu_s(pid)
        start = time.perf_counter()
        results = await asyncio.gather(*(client.generate({
            "input_ids": p, "sampling_params": {"temperature": 0, "max_new_tokens": n, "ignore_eos": True}})
            for p, n in zip(prompts, lens)))
        elapsed = time.perf_counter() - start
        cpu = _process_cpu_s(pid) - cpu
    return elapsed, sum(r["meta_info"]["completion_tokens"] for r in results), cpu


def _hf_run(model, prompts: list[list[int]], lens: list[int]) -> tuple[float, int, float]:
    from transformers import GenerationConfig

    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    gen = GenerationConfig(max_new_tokens=max(lens), do_sample=False, eos_token_id=None, pad_token_id=0)
    start, cpu = time.perf_counter(), time.process_time()
    with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, generation_config=gen)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    assert out.shape[1] - width == max(lens), "baseline stopped early"
    return elapsed, sum(lens), cpu


def bench_decode(url: str, pid: int, model_dir: Path, args) -> list[dict]:
    """Rows {scenario, engine_tok_s, hf_tok_s, ratio, cpu ratio} per response-length scenario
    (`pid`: the engine's process)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    prompts = [torch.randint(0, vocab, (args.prompt_len,), generator=gen).tolist() for _ in range(args.batch)]
    asyncio.run(_engine_run(url, prompts[:2], [4, 4], pid))  # warm-up
    _hf_run(model, prompts[:2], [4, 4])
    rows = []
    for name, lens in scenarios(args.batch, args.max_response_len).items():
        runs = [(asyncio.run(_engine_run(url, prompts, lens, pid)), _hf_run(model, prompts, lens))
                for _ in range(args.repeats)]
        e_time, e_tok = statistics.median(e[0] for e, _ in runs), runs[0][0][1]
        h_time, h_tok = statistics.median(h[0] for _, h in runs), runs[0][1][1]
        e_cpu, h_cpu = statistics.median(e[2] for e, _ in runs), statistics.median(h[2] for _, h in runs)
        rows.append({"scenario": name, "batch": args.batch, "useful_tokens": h_tok, "engine_tok_s": e_tok / e_time,
                     "hf_generate_tok_s": h_tok / h_time, "ratio_engine_over_hf": (e_tok / e_time) / (h_tok / h_time),
                     "engine_cpu_s": e_cpu, "hf_generate_cpu_s": h_cpu,
                     "cpu_ratio_engine_over_hf": (e_tok / e_cpu) / (h_tok / h_cpu)})
    return rows


def _raw_receiver(port: int, specs: list, rounds: int) -> None:
    from slime.utils.weight_transport import init_weight_update_group

    group = init_weight_update_group("127.0.0.1", port, 1, 2, "bench_raw", "gloo")
    for _ in range(rounds):
        for shape, dtype in specs:
            group.broadcast(torch.empty(shape, dtype=dtype), src=0)


def _raw_broadcast_s(named: dict[str, torch.Tensor], rounds: int) -> float:
    import multiprocessing as mp

    from slime.utils.weight_transport import init_weight_update_group

    port = free_port()
    specs = [(tuple(t.shape), t.dtype) for t in named.values()]
    proc = mp.get_context("spawn").Process(target=_raw_receiver, args=(port, specs, rounds))
    proc.start()
    group = init_weight_update_group("127.0.0.1", port, 0, 2, "bench_raw", "gloo")
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for t in named.values():
            group.broadcast(t, src=0)
        times.append(time.perf_counter() - start)
    proc.join(timeout=120)
    return min(times)


def _engine_sync_s(url: str, named: dict[str, torch.Tensor], rounds: int) -> float:
    from slime.utils.engine_client import SyncEngineClient
    from slime.utils.weight_transport import init_weight_update_group

    client, port, names = SyncEngineClient(url), free_port(), list(named)
    joiner = threading.Thread(target=client.init_weights_update_group, args=("127.0.0.1", port, 1, 2, "bench", "gloo"))
    joiner.start()
    group = init_weight_update_group("127.0.0.1", port, 0, 2, "bench", "gloo")
    joiner.join()
    times = []
    for r in range(rounds):
        start = time.perf_counter()
        client.begin_weight_update()  # a sync is one session (SGLang 0.5.23's protocol, the engine's)
        call = threading.Thread(target=client.update_weights_from_distributed, args=(
            names, [str(named[n].dtype).removeprefix("torch.") for n in names], [list(named[n].shape) for n in names],
            "bench", True, f"bench-{r}"))
        call.start()
        for n in names:
            group.broadcast(named[n], src=0)
        call.join()
        client.end_weight_update()
        times.append(time.perf_counter() - start)
    client.destroy_weights_update_group("bench")
    return min(times)


def bench_sync(url: str, model_dir: Path, rounds: int) -> dict:
    """Seconds per GB of an engine weight update vs a raw gloo broadcast of the same tensors."""
    from safetensors.torch import load_file

    named = {k: v for f in sorted(model_dir.glob("*.safetensors")) for k, v in load_file(f).items()}
    gb = sum(t.numel() * t.element_size() for t in named.values()) / 1e9
    engine_s, raw_s = _engine_sync_s(url, named, rounds), _raw_broadcast_s(named, rounds)
    return {"payload_gb": gb, "tensors": len(named), "engine_s_per_gb": engine_s / gb, "raw_gloo_s_per_gb": raw_s / gb,
            "ratio_engine_over_raw": engine_s / raw_s}


def print_report(decode_rows: list[dict], sync: dict | None) -> None:
    print(f"{'model':<8}{'scenario':<10}{'batch':>6}{'tokens':>8}{'engine tok/s':>14}{'hf tok/s':>10}{'ratio':>8}"
          f"{'cpu ratio':>11}")
    for r in decode_rows:
        print(f"{r['model']:<8}{r['scenario']:<10}{r['batch']:>6}{r['useful_tokens']:>8}{r['engine_tok_s']:>14.1f}"
              f"{r['hf_generate_tok_s']:>10.1f}{r['ratio_engine_over_hf']:>8.2f}{r['cpu_ratio_engine_over_hf']:>11.2f}")
    if sync is None:
        return
    print(f"\nweight sync ({sync['payload_gb'] * 1e3:.1f} MB, {sync['tensors']} tensors): engine "
          f"{sync['engine_s_per_gb']:.2f} s/GB vs raw gloo {sync['raw_gloo_s_per_gb']:.2f} s/GB "
          f"(ratio {sync['ratio_engine_over_raw']:.2f})")


def main() -> None:
    from slime.backends.local_engine.launcher import launch_local_engine, stop_local_engine

    args = parse_args()
    torch.set_num_threads(args.num_threads)
    decode_rows, sync = [], None
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        tiny = Path(args.model_path) if args.model_path else _load_tool("make_tiny_model").make_tiny_model(tmp / "moe")
        wide = make_sync_model(tiny, tmp, args.sync_hidden, args.sync_layers)
        for label, model_dir in (("tiny", tiny), ("wide", wide)):
            port = free_port()
            proc = launch_local_engine(model_dir, port, extra_args=("--num-threads", str(args.num_threads)),
                                       log_path=os.devnull)
            try:
                url = f"http://127.0.0.1:{port}"
                decode_rows += [{"model": label, **row} for row in bench_decode(url, proc.pid, model_dir, args)]
                if label == "wide" and not args.skip_sync:
                    sync = bench_sync(url, model_dir, args.sync_rounds)
            finally:
                stop_local_engine(proc)
    print_report(decode_rows, sync)
    Path(args.out).write_text(json.dumps({"decode": decode_rows, "sync": sync, "args": vars(args)}, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
