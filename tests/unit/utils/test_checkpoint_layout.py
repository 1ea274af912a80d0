"""The checkpoint folder layout read as plain files: what `--load` / `--ref-load` / `--critic-load`
must hold, slime's first launch, the `release` tracker, and the staged save's rename order."""

import pytest

from slime.utils.checkpoint_layout import (
    TRACKER_FILE,
    describe_checkpoint,
    first_launch,
    iteration_dir,
    load_problem,
    prepare_staging,
    publish,
    read_tracker,
    staging_dir,
)


def _complete(folder):
    folder.mkdir(parents=True)
    for name in ("common.pt", ".metadata", "metadata.json", "__0_0.distcp"):
        (folder / name).write_bytes(b"x")
    return folder


def _checkpoint(root, iteration):
    _complete(iteration_dir(root, iteration))
    (root / TRACKER_FILE).write_text(str(iteration))
    return root


def test_read_tracker_numbers_and_release(tmp_path):
    assert read_tracker(tmp_path) is None
    (tmp_path / TRACKER_FILE).write_text("12\n")
    assert read_tracker(tmp_path) == 12
    (tmp_path / TRACKER_FILE).write_text("release")
    assert read_tracker(tmp_path) == "release"
    assert iteration_dir(tmp_path, "release") == tmp_path / "release"
    (tmp_path / TRACKER_FILE).write_text("latest")
    with pytest.raises(ValueError, match=TRACKER_FILE):
        read_tracker(tmp_path)


def test_complete_checkpoints(tmp_path):
    assert describe_checkpoint(_checkpoint(tmp_path / "a", 7)) is None
    assert describe_checkpoint(_checkpoint(tmp_path / "b", "release")) is None


@pytest.mark.parametrize("make,want", [
    (lambda p: None, "does not exist"),
    (lambda p: p.write_text("x"), "is a file"),
    (lambda p: p.mkdir(), f"has no {TRACKER_FILE} (not a Megatron"),
    (lambda p: (p.mkdir(), (p / "config.json").write_text("{}"), (p / "model.safetensors").write_bytes(b"")),
     "a Hugging Face folder"),
    (lambda p: _complete(p), "it is an iteration folder; give its parent"),
    (lambda p: _complete(p / "iter_0000004"), "beside iter_0000004"),
    (lambda p: (p.mkdir(), (p / TRACKER_FILE).write_text("oops")), "holds 'oops'"),
    (lambda p: (p.mkdir(), (p / TRACKER_FILE).write_text("3")), "names iter_0000003, which is missing"),
    (lambda p: ((p / "iter_0000003").mkdir(parents=True), (p / TRACKER_FILE).write_text("3")),
     "iter_0000003 lacks common.pt, .metadata, metadata.json"),
])
def test_incomplete_checkpoints_say_what_is_missing(tmp_path, make, want):
    path = tmp_path / "ckpt"
    make(path)
    assert want in describe_checkpoint(path)
    assert load_problem("--load", path).startswith(f"--load {path} ")


def test_first_launch_is_the_save_folder_without_a_checkpoint(tmp_path):
    save = tmp_path / "run"
    assert first_launch(str(save) + "/", save)  # missing: slime's recipes pass "X_slime/" for both
    assert load_problem("--load", str(save) + "/", save) is None
    save.mkdir()
    (save / "run.lock").write_text("123")  # other files (a lock, logs) do not make it a checkpoint
    assert first_launch(save, save) and load_problem("--load", save, save) is None
    assert not first_launch(save, tmp_path / "other")
    assert "--load" in load_problem("--load", save, tmp_path / "other")
    _complete(save / "iter_0000002")  # iterations without a tracker: not a first launch, an error
    assert not first_launch(save, save)
    assert "beside iter_0000002" in load_problem("--load", save, save)


def test_publish_renames_then_replaces_the_tracker(tmp_path):
    save = _checkpoint(tmp_path / "save", 1)
    staging = prepare_staging(save, 2)
    assert staging == staging_dir(save, 2) and staging.name.startswith(".")
    (staging / "half.distcp").write_bytes(b"x")  # an interrupted save stops here
    assert read_tracker(save) == 1 and describe_checkpoint(save) is None
    assert not iteration_dir(save, 2).exists()
    assert not list(prepare_staging(save, 2).iterdir())  # the next save of 2 starts clean
    for name in ("common.pt", ".metadata", "metadata.json"):
        (staging / name).write_bytes(b"new")
    assert publish(save, 2) == iteration_dir(save, 2)
    assert read_tracker(save) == 2 and describe_checkpoint(save) is None and not staging.exists()


def test_publish_replaces_a_folder_of_the_same_iteration(tmp_path):
    save = _checkpoint(tmp_path / "save", 1)
    staging = prepare_staging(save, 1)
    for name in ("common.pt", ".metadata", "metadata.json"):
        (staging / name).write_bytes(b"new")
    publish(save, 1)
    assert (iteration_dir(save, 1) / "common.pt").read_bytes() == b"new"
    assert sorted(p.name for p in save.iterdir()) == ["iter_0000001", TRACKER_FILE]
