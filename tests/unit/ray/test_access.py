"""What the job's engines accept: the folders of its flags, its trainer's addresses (loopback on one node)."""

from types import SimpleNamespace

from slime.ray import access


def test_weight_dirs_are_the_jobs_folder_flags():
    args = SimpleNamespace(hf_checkpoint="/m/hf", load=None, save="/r/ckpt", save_hf="/r/hf_final", ref_load="/r/ref",
                           metrics_dir="/r", prompt_data="/data/train.jsonl")
    assert access.job_weight_dirs(args) == ("/m/hf", "/r/ckpt", "/r/hf_final", "/r/ref", "/r")


def test_trainer_hosts(monkeypatch):
    placement = SimpleNamespace(locations=[("10.0.0.2", "n2", 0), ("10.0.0.2", "n2", 1), ("10.0.0.3", "n3", 0)])
    monkeypatch.setattr(access, "single_node", lambda: False)
    assert access.trainer_hosts(placement, (0, 1)) == ("10.0.0.2",)  # not the engine-only node
    assert access.trainer_hosts(placement, ()) == (access.LOOPBACK,)  # --debug-rollout-only: nobody else
    monkeypatch.setattr(access, "single_node", lambda: True)
    assert access.trainer_hosts(placement, (0,)) == ("10.0.0.2", access.LOOPBACK)
