"""ActorSide's weight syncs against a recording trainer group and rollout side: the engines'
URLs and version of the last sync are kept, and engines restarted since (new URLs) get that
version again before the next generation (--use-fault-tolerance)."""

from types import SimpleNamespace

from slime.ray.job import ActorSide


class Group:
    def __init__(self):
        self.calls = []

    def run(self, method, *args):
        self.calls.append((method, *args))


class Rollout:
    def __init__(self, urls):
        self.urls = urls

    def engine_urls(self):
        return list(self.urls)

    def onload(self, tags=None):
        pass


def _actor():
    args = SimpleNamespace(debug_rollout_only=True, debug_train_only=False, use_fault_tolerance=True,
                           colocate=False, offload_train=False, offload_rollout=False)
    actor = ActorSide(args, placement=(None, None))
    actor.group = Group()
    return actor


def test_restarted_engine_gets_the_last_version_again():
    actor, rollout = _actor(), Rollout(["http://e:1"])
    actor.resync_restarted_engines(rollout)  # nothing synced yet: nothing to repeat
    assert actor.group.calls == []
    actor.sync_weights(rollout, version=3)
    actor.resync_restarted_engines(rollout)  # same engines: no second sync
    assert actor.group.calls == [("update_weights", ["http://e:1"], "3")]
    rollout.urls = ["http://e:2"]  # engine restarted at a new port
    actor.resync_restarted_engines(rollout)
    assert actor.group.calls[-1] == ("update_weights", ["http://e:2"], "3")
    assert actor.synced == (["http://e:2"], 3)
