"""MoE routing replay (R3) in the trainer on gloo ranks, against an engine's routing.

The "engine" is the tiny MoE in transformers (the local engine's routing equals it token for
token: tests/unit/backends/local_engine/test_generate.py). Its routing has SGLang's rows (every
fed token: len(tokens) - 1). One engine runs the trainer's weights: the trainer's own routing
must equal it token for token, which also checks the row layout under TP + sequence parallel +
EP, and replaying that routing must change no log-prob (a misplaced row would force another
expert). A second engine has noisy router weights (a drifted policy): replaying its routing must
bring the trainer's log-probs closer to the engine's than the trainer's own routing does, in the
old log-prob pass and in the training step (train_rollout_logprob_abs_diff).
"""

import os

import numpy as np
import pytest
import torch

from tests.distributed.megatron_harness import build_trainer, fixed_rollout_data
from tests.unit.backends.megatron_utils.spawn_util import spawn

pytestmark = pytest.mark.distributed

ROUTER_NOISE = 0.5  # relative std of the noise on the second engine's router weights


def _engine(hf_dir, data: dict, router_noise: float) -> tuple[list, list]:
    """(routed experts [len - 1, layers, topk] int32, response log-probs) per sample."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for layer in model.model.layers:
            w = layer.mlp.gate.weight
            w.add_(router_noise * w.std() * torch.randn(w.shape, generator=g))
    routed, log_probs = [], []
    k = model.config.num_experts_per_tok
    for tokens, resp in zip(data["tokens"], data["response_lengths"]):
        with torch.no_grad():
            out = model(input_ids=torch.tensor([tokens]), output_router_logits=True)
        experts = torch.stack([torch.topk(r.float().softmax(-1), k, -1).indices for r in out.router_logits], 1)
        routed.append(experts[:-1].to(torch.int32).numpy())
        logp = out.logits[0, -resp - 1:-1].float().log_softmax(-1)
        log_probs.append(logp.gather(1, torch.tensor(tokens[-resp:])[:, None])[:, 0].tolist())
    return routed, log_probs


def _worker(rank, world, hf_dir, extra, data, same):
    from slime.backends.megatron_utils.parallel import destroy_parallel
    from slime.backends.megatron_utils.routing_replay import REPLAY_KEY

    _, trainer = build_trainer(hf_dir, world, extra + ["--use-rollout-routing-replay"], rank,
                               int(os.environ["MASTER_PORT"]))
    mine = list(range(len(data["tokens"])))
    probe = dict(data)
    own = trainer.compute_log_prob(probe, mine, routing="record")
    recorded = [t.numpy() for t in probe[REPLAY_KEY]]
    probe[REPLAY_KEY] = same
    replayed_same = trainer.compute_log_prob(probe, mine, routing="replay")
    probe[REPLAY_KEY] = data["rollout_routed_experts"]
    replayed = trainer.compute_log_prob(probe, mine, routing="replay")
    metrics = trainer.train(0, dict(data))
    destroy_parallel()
    def log_probs(out):
        return out and out["log_probs"]
    return {"own": log_probs(own), "replayed_same": log_probs(replayed_same), "replayed": log_probs(replayed),
            "recorded": recorded, "metrics": metrics}


@pytest.fixture(scope="module")
def engines(tiny_moe_hf):
    data = fixed_rollout_data()
    same, _ = _engine(tiny_moe_hf, data, 0.0)
    noisy, noisy_lp = _engine(tiny_moe_hf, data, ROUTER_NOISE)
    data.update(rollout_routed_experts=noisy, rollout_log_probs=noisy_lp)
    return data, same


def _gap(log_probs: dict, engine_lp: list) -> float:
    """Mean over response tokens of |trainer - engine| log-prob."""
    return float(np.mean(np.concatenate([np.abs(log_probs[i].numpy() - np.asarray(lp))
                                         for i, lp in enumerate(engine_lp)])))


def _sample_mean_gap(log_probs: dict, engine_lp: list) -> float:
    """slime's reduction of train_rollout_logprob_abs_diff: each sample's token mean, averaged."""
    return float(np.mean([np.abs(log_probs[i].numpy() - np.asarray(lp)).mean() for i, lp in enumerate(engine_lp)]))


def _sorted(a):
    return np.sort(np.asarray(a), axis=-1)


@pytest.fixture(scope="module")
def tp2_sp_ep2(engines, tiny_moe_hf, tmp_path_factory):
    data, same = engines
    # rows padded to TP x 2 = 4 tokens (slime's --data-pad-size-multiplier): each TP rank still
    # replays its half of the row under SP, not a quarter
    extra = ["--tensor-model-parallel-size", "2", "--sequence-parallel", "--expert-model-parallel-size", "2",
             "--expert-tensor-parallel-size", "1", "--data-pad-size-multiplier", "2"]
    return spawn(_worker, 2, tmp_path_factory.mktemp("r3_tp2"), hf_dir=str(tiny_moe_hf), extra=extra, data=data,
                 same=same)


def test_replay_under_tp2_sp_ep2_follows_the_engine_token_for_token(engines, tp2_sp_ep2):
    data, same = engines
    ranks = tp2_sp_ep2
    for r in ranks:  # each TP rank's share of the row, gathered: the trainer routes as the engine
        for rec, eng, tokens in zip(r["recorded"], same, data["tokens"]):
            assert np.array_equal(_sorted(rec[:len(tokens) - 1]), _sorted(eng)), "trainer and engine route differently"
    out = ranks[0]
    for i, own in out["own"].items():  # replaying the routing the trainer would choose changes nothing
        torch.testing.assert_close(out["replayed_same"][i], own, rtol=0, atol=1e-6)
    flips = sum(int((_sorted(a) != _sorted(b)).any(-1).any(-1).sum()) for a, b in zip(same, data["rollout_routed_experts"]))
    assert flips > 0, "the noisy engine must route some tokens differently, or the gap check says nothing"
    own_gap, replay_gap = _gap(out["own"], data["rollout_log_probs"]), _gap(out["replayed"], data["rollout_log_probs"])
    print(f"R3 tiny MoE: {flips} tokens routed differently; |train - rollout| log-prob gap "
          f"{own_gap:.5f} own routing, {replay_gap:.5f} replayed")
    assert replay_gap < own_gap
    want = _sample_mean_gap(out["replayed"], data["rollout_log_probs"])  # the step's old log-probs were replayed
    assert out["metrics"]["train/train_rollout_logprob_abs_diff"] == pytest.approx(want, rel=1e-4, abs=1e-7)


def test_full_recompute_replays_the_same_routing_in_backward(engines, tp2_sp_ep2, tiny_moe_hf, tmp_path):
    """With --recompute-granularity full each layer's forward runs again inside backward: its router
    must take that micro-batch's replayed indices again (megatron's REPLAY_BACKWARD queue). Under
    PP2's 1F1B schedule a stage runs the next micro-batch's forward before this one's backward, so
    the current forward's indices would be the wrong ones; the step must equal the one without
    recompute (the TP2/SP/EP2 run; layouts agree: test_megatron_train)."""
    data, same = engines
    extra = ["--pipeline-model-parallel-size", "2",
             "--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    pp2 = spawn(_worker, 2, tmp_path, hf_dir=str(tiny_moe_hf), extra=extra, data=data, same=same)
    for key in ("train/loss", "train/grad_norm", "train/pg_loss", "train/train_rollout_logprob_abs_diff"):
        assert pp2[0]["metrics"][key] == pytest.approx(tp2_sp_ep2[0]["metrics"][key], rel=1e-5, abs=1e-6), key
