"""Colocated sync: the flattened bucket a rank shares with its engine stays alive until the engine
answered, and then torch's CUDA IPC limbo is collected and the cache emptied, bucket by bucket
(here CUDA is simulated: the calls are recorded, the tensors are CPU ones)."""

import weakref

import torch

from slime.backends.megatron_utils.update_weight import from_tensor
from slime.backends.megatron_utils.update_weight.from_tensor import UpdateWeightFromTensor, _Membership
from slime.utils.tensor_payload import use_file_system_sharing


def test_each_bucket_is_collected_after_the_engine_answered(monkeypatch):
    use_file_system_sharing()
    events, shared = [], []
    real_serialize = from_tensor.serialize_flattened_bucket

    def serialize(bucket):
        entry, keep_alive = real_serialize(bucket)
        shared.append(weakref.ref(keep_alive["flattened_tensor"]))
        return entry, keep_alive

    def post(urls, call, timeout):
        events.append(("answered", shared[-1]() is not None))  # the engine has its memory until here
        return [None]

    monkeypatch.setattr(from_tensor, "serialize_flattened_bucket", serialize)
    monkeypatch.setattr(from_tensor, "run_on_engines", post)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "ipc_collect", lambda: events.append(("ipc_collect", shared[-1]() is None)))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: events.append(("empty_cache", None)))

    sender = UpdateWeightFromTensor(["http://127.0.0.1:9"], lambda: iter(()))
    sender._connected, sender._member = True, _Membership(0, [0], None)
    for i in range(2):
        sender.send_bucket([("a", torch.full((4,), float(i))), ("b", torch.ones(2))], str(i))
    assert events == [("answered", True), ("ipc_collect", True), ("empty_cache", None)] * 2
