"""`SlotKV`'s lean decode step computes what the HF forward computes, while rows join and leave.

Per tiny model (Qwen3-MoE and dense Qwen3): prefill a left-padded group, decode a few steps, drop a
middle row, admit a new group, decode again; each step's logits must match a full HF forward of
the row's whole sequence (no cache) at its last position. Models of other families keep the HF
path (`supports_slot_kv` is false).
"""

import pytest
import torch

from slime.backends.local_engine.slot_kv import SlotKV, supports_slot_kv


def _prefill(model, kv: SlotKV, prompts: list[list[int]]) -> list[int]:
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    out = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp(min=0), use_cache=True)
    layers = out.past_key_values.layers
    kv.add_rows([x.keys for x in layers], [x.values for x in layers], mask)
    return out.logits[:, -1].argmax(-1).tolist()


def _decode_and_check(model, kv: SlotKV, seqs: list[list[int]]) -> None:
    logits = kv.decode_logits(model, torch.tensor([[s[-1]] for s in seqs]))
    for row, seq in enumerate(seqs):
        ref = model(input_ids=torch.tensor([seq])).logits[0, -1]
        torch.testing.assert_close(logits[row], ref, rtol=1e-4, atol=1e-4)
        seq.append(int(logits[row].argmax()))


@pytest.mark.parametrize("variant", ["moe", "dense"])
def test_decode_matches_hf_forward_as_rows_change(variant, tiny_moe_hf, tiny_dense_hf):
    from transformers import AutoModelForCausalLM

    path = tiny_moe_hf if variant == "moe" else tiny_dense_hf
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    assert supports_slot_kv(model)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 128, (n,), generator=gen).tolist() for n in (5, 11, 3)]
    kv = SlotKV()
    with torch.inference_mode():
        seqs = [p + [t] for p, t in zip(prompts, _prefill(model, kv, prompts))]
        for _ in range(3):
            _decode_and_check(model, kv, seqs)
        kv.keep_rows([0, 2])
        seqs = [seqs[0], seqs[2]]
        late = [torch.randint(0, 128, (7,), generator=gen).tolist()]
        seqs += [p + [t] for p, t in zip(late, _prefill(model, kv, late))]
        for _ in range(20):  # past the first capacity: the buffers grow
            _decode_and_check(model, kv, seqs)
    assert kv.rows == 3 and kv.nbytes() > 0
    kv.keep_rows([])
    assert kv.rows == 0 and kv.nbytes() == 0


def test_other_model_families_keep_the_hf_path():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1)
    assert not supports_slot_kv(LlamaForCausalLM(config))
