"""An SGLang engine's side of a weight-update group, run in its own process by test_rendezvous.py.

`python -m tests.conformance.against_sglang.sglang_group_peer SPEC.json OUT.pt [SPEC.json OUT.pt ...]`
joins, one after the other, each group described in a SPEC ({master_address, master_port,
rank_offset, world_size, group_name, names, dtypes, shapes, load_format}; one process for all of
them: importing SGLang's model runner is most of its time) with SGLang's own model-runner code: `init_weights_update_group` (which calls
`init_custom_process_group(backend, init_method="tcp://...", world_size, rank, group_name)`), then
receives the tensors the way its `/update_weights_from_distributed` does, destroys the group with
its `destroy_weights_update_group`, and saves {name: tensor} to OUT. The model-runner methods are
called on a stand-in `self` holding only the attributes they read (tp_rank, device, the group
dict, a model whose `load_weights` records what it is given): the rendezvous and broadcast code is
SGLang's, unchanged.
"""

import json
import sys
import types

import torch
import torch.distributed as dist

from tests.conformance.against_sglang.conftest import declare_torchvision_ops


class _Recorder:
    """Stands in for the model: keeps the (name, tensor) pairs SGLang loads."""

    def __init__(self):
        self.loaded = []

    def load_weights(self, weights):
        self.loaded.extend(weights)


def _runner_functions():
    """(init, receive(runner, spec) -> [(name, tensor)], destroy) of the installed release."""
    try:  # 0.5.2x: the weight methods moved to a WeightUpdater component
        from sglang.srt.model_executor.model_runner_components.weight_updater import WeightUpdater as cls

        def receive(runner, spec):
            return cls.receive_weights_from_distributed(runner, names=spec["names"], dtypes=spec["dtypes"],
                                                        shapes=spec["shapes"], group_name=spec["group_name"],
                                                        load_format=spec.get("load_format"))
    except ImportError:  # 0.5.15.post1: methods of ModelRunner, which loads what it received
        from sglang.srt.model_executor.model_runner import ModelRunner as cls

        def receive(runner, spec):
            ok, message = cls.update_weights_from_distributed(runner, spec["names"], spec["dtypes"], spec["shapes"],
                                                              spec["group_name"], load_format=spec.get("load_format"))
            assert ok, message
            return runner.model.loaded
    receive.bucketed = [getattr(cls, name) for name in ("_receive_bucketed_weights_from_distributed",
                                                        "_update_bucketed_weights_from_distributed") if hasattr(cls, name)]
    return cls.init_weights_update_group, receive, cls.destroy_weights_update_group


def main(paths: list[str]) -> None:
    keep = declare_torchvision_ops()  # noqa: F841  (sglang imports torchvision)
    functions = _runner_functions()
    # SGLang's engine process always has a default group (its TP world); one of size 1 here.
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    for spec_path, out_path in zip(paths[::2], paths[1::2]):
        _join_and_receive(functions, json.load(open(spec_path)), out_path)


def _join_and_receive(functions, spec: dict, out_path: str) -> None:
    init, receive, destroy = functions
    runner = types.SimpleNamespace(tp_rank=0, device="cpu", _model_update_group={}, model=_Recorder())
    for method in receive.bucketed:  # what the flattened-bucket branch calls on `self`
        setattr(runner, method.__name__, types.MethodType(method, runner))
    ok, message = init(runner, spec["master_address"], spec["master_port"], spec["rank_offset"],
                       spec["world_size"], spec["group_name"], backend="gloo")
    assert ok, message
    received = {name: tensor.clone() for name, tensor in receive(runner, spec)}
    ok, message = destroy(runner, spec["group_name"])
    assert ok, message
    torch.save(received, out_path)


if __name__ == "__main__":
    main(sys.argv[1:])
