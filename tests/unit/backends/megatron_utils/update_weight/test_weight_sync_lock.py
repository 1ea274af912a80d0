"""The disaggregated senders of all pipeline stages hold one cluster-wide lock around every
transfer the engines serve in order (group join, each bucket, group drop): engines take weight
requests one at a time, so two stages broadcasting at once can deadlock across two engines."""

import datetime
import threading
import time
import types

import pytest
import torch
import torch.distributed as dist

from slime.backends.megatron_utils.update_weight.common import StoreLock, TrainerRole
from slime.backends.megatron_utils.update_weight.from_distributed import UpdateWeightFromDistributed


@pytest.fixture
def store():
    server = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=30))
    yield server


def _client(server):
    return dist.TCPStore("127.0.0.1", server.port, 1, False, timeout=datetime.timedelta(seconds=30))


class _Recorder:
    """Stands in for the engines and the broadcast: logs (stage, event), yielding the CPU in between
    so that an unlocked second sender would interleave."""

    def __init__(self):
        self.events, self.mutex = [], threading.Lock()

    def log(self, tag, event):
        with self.mutex:
            self.events.append((tag, event))
        time.sleep(0.005)


def _sender(tag: str, store, recorder: _Recorder) -> UpdateWeightFromDistributed:
    role = TrainerRole(is_leader=False, is_sender=True, stage_tag=tag,
                       lock=lambda: StoreLock(store, "slime/weight_sync_lock", tag, timeout_s=60))
    sender = UpdateWeightFromDistributed(["http://127.0.0.1:9"], lambda: iter(()), role, backend="gloo",
                                         master_address="127.0.0.1")

    def broadcast(_tensor, src):  # the bucket's one broadcast, in two logged halves
        recorder.log(tag, "broadcast begins")
        recorder.log(tag, "broadcast ends")

    def on_engines(_call):
        recorder.log(tag, "post")
        recorder.log(tag, "answered")
        return []

    sender.group = types.SimpleNamespace(device="cpu", broadcast=broadcast)
    sender.on_engines = on_engines
    return sender


def test_two_pipeline_stages_send_their_buckets_one_at_a_time(store):
    recorder = _Recorder()
    senders = [_sender("pp0", store, recorder), _sender("pp1", _client(store), recorder)]
    bucket = [("a", torch.zeros(2)), ("b", torch.zeros(2))]

    def run(sender):
        for i in range(4):
            sender.send_bucket(bucket, str(i))

    threads = [threading.Thread(target=run, args=(s,)) for s in senders]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    tags = [tag for tag, _ in recorder.events]
    per_bucket = 4  # post, answered, broadcast begins, broadcast ends
    assert len(tags) == 2 * 4 * per_bucket
    runs = [tags[i:i + per_bucket] for i in range(0, len(tags), per_bucket)]
    assert all(len(set(run)) == 1 for run in runs), f"two stages' buckets interleaved: {recorder.events}"
    assert store.get("slime/weight_sync_lock") == b""  # released


def test_store_lock_names_its_holder_when_waiting_too_long(store):
    with StoreLock(store, "k", "pp0"):
        with pytest.raises(TimeoutError, match="pp0"):
            with StoreLock(_client(store), "k", "pp1", timeout_s=0.1):
                pass
    with StoreLock(store, "k", "pp1"):  # released on exit: free again
        pass
