"""TrainerMemory on a plain torch model and Adam: each tag frees exactly its storages (views keep
sharing them), offload/onload are idempotent per tag, the bytes come back bit for bit and the
grads come back zeroed; on a GPU the allocator's memory drops after offload."""

import pytest
import torch

from slime.backends.megatron_utils.offload import TrainerMemory


def _setup(device="cpu"):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 4)).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model(torch.randn(8, 16, device=device)).square().mean().backward()
    opt.step()
    return model, opt


def _step(model, opt, device="cpu"):
    opt.zero_grad()
    model(torch.ones(8, 16, device=device)).square().mean().backward()
    opt.step()
    return [p.detach().clone() for p in model.parameters()]


def test_tags_free_their_storages_and_onload_restores_bytes():
    model, opt = _setup()
    memory = TrainerMemory([model], opt, device_type="cpu")
    weights = [p.detach().clone() for p in model.parameters()]
    state = [v.clone() for s in opt.state.values() for v in s.values()]
    view = model[0].weight[:2]  # a view shares the parameter's storage
    held = memory.held_bytes()
    assert held["weights"] == sum(p.numel() * 4 for p in model.parameters())
    assert held["optimizer"] > 0 and held["grads"] == held["weights"]

    memory.offload(["weights"])
    assert memory.offloaded == ["weights"] and memory.held_bytes()["weights"] == 0
    assert view.untyped_storage().nbytes() == 0 and memory.held_bytes()["optimizer"] == held["optimizer"]
    memory.offload(["weights", "optimizer", "grads"])  # weights again: a no-op
    assert memory.held_bytes() == {"weights": 0, "optimizer": 0, "grads": 0}

    memory.onload(["weights", "optimizer", "grads"])
    assert memory.offloaded == [] and memory.held_bytes() == held
    assert all(torch.equal(a, b) for a, b in zip(weights, model.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(state, (v for s in opt.state.values() for v in s.values())))
    assert all(not p.grad.any() for p in model.parameters())  # grads come back zeroed, not copied
    assert torch.equal(view, model[0].weight[:2])


def test_training_after_onload_matches_training_without_offload():
    plain_model, plain_opt = _setup()
    model, opt = _setup()
    memory = TrainerMemory([model], opt, device_type="cpu")
    for _ in range(2):
        memory.offload(["optimizer", "grads"])
        memory.offload(["weights"])
        memory.onload(["weights", "optimizer", "grads"])
        assert all(torch.equal(a, b) for a, b in zip(_step(plain_model, plain_opt), _step(model, opt)))


def test_every_offload_reuses_one_host_buffer_per_tag():
    """The host copies go into one buffer per tag (pinned on GPUs), allocated at the first offload
    and reused by every later one: no fresh ~15 GB pinned allocation per hand-over."""
    model, opt = _setup()
    memory = TrainerMemory([model], opt, device_type="cpu")
    first = {}
    for round_ in range(3):
        memory.offload()
        hosts = {tag: [h for _, h, _ in memory._host[tag]] for tag in ("weights", "optimizer")}
        ptrs = {tag: {h.untyped_storage().data_ptr() for h in hs} for tag, hs in hosts.items()}
        assert all(len(p) == 1 for p in ptrs.values())  # every storage of a tag in the tag's one buffer
        if round_ == 0:
            first = ptrs
        assert ptrs == first
        memory.onload()
        _step(model, opt)


def test_unknown_tag_is_refused():
    model, opt = _setup()
    with pytest.raises(ValueError, match="kv_cache"):
        TrainerMemory([model], opt, device_type="cpu").offload(["kv_cache"])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_offload_returns_memory_to_the_allocator():
    model, opt = _setup("cuda")
    memory = TrainerMemory([model], opt)
    before = torch.cuda.memory_allocated()
    metrics = memory.offload(["weights", "optimizer", "grads"])
    assert metrics["perf/train_memory_allocated_gib"] * 2**30 < before
    assert torch.cuda.memory_allocated() <= before - sum(p.numel() * 4 * 4 for p in model.parameters())
    memory.onload(["weights", "optimizer", "grads"])
    assert torch.cuda.memory_allocated() == before
