"""HostReference: the reference weights live on the host and are swapped into the actor for the
reference pass (one model on the device); the actor's weights come back bit for bit."""

import pytest
import torch

from slime.backends.megatron_utils.reference import HostReference


def _model(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3))
    model.register_buffer("bias_stat", torch.randn(3))
    return model


def _state(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_reference_weights_run_in_the_actor_and_the_actor_comes_back():
    actor, ref_model = _model(0), _model(1)
    x = torch.randn(2, 4)
    want_ref, want_actor, actor_state = ref_model(x), actor(x), _state(actor)
    reference = HostReference.from_module(ref_model)
    del ref_model  # nothing of it is needed any more
    for _ in range(2):
        with reference.swapped_into(actor):
            assert torch.equal(actor(x), want_ref)
            assert torch.equal(actor.bias_stat, reference.tensors["buffer:bias_stat"])
        assert all(torch.equal(v, actor_state[k]) for k, v in actor.state_dict().items())
        assert torch.equal(actor(x), want_actor)
    backup = reference._backup["param:0.weight"].untyped_storage().data_ptr()
    with pytest.raises(ValueError), reference.swapped_into(actor):
        raise ValueError("a failing pass")
    assert all(torch.equal(v, actor_state[k]) for k, v in actor.state_dict().items())
    assert reference._backup["param:0.weight"].untyped_storage().data_ptr() == backup  # reused


def test_refresh_takes_the_actor_weights_and_mismatched_models_are_refused():
    actor, ref_model = _model(0), _model(1)
    reference = HostReference.from_module(ref_model)
    reference.refresh_from(actor)
    assert torch.equal(reference.tensors["param:0.weight"], actor[0].weight.detach())
    with pytest.raises(RuntimeError, match="different tensors"):
        reference.swapped_into(torch.nn.Linear(4, 3)).__enter__()
