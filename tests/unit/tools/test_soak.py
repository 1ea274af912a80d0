"""tools/soak.sh: clones the committed HEAD into fresh folders, runs the command in each, counts
passes, reads the run's metrics and shows the first failure's log tail.

The script runs here on a scratch git repository holding only itself, with SOAK_COMMAND standing in
for the main job (the real job was run by hand: see docs/quick-start.md).
"""

import os
import shutil
import subprocess

import pytest

# Run i writes metrics; the second run fails after printing a marker line.
STUB = (
    'n=$(cat "$SOAK_TEST_COUNTER" 2>/dev/null || echo 0); echo $((n + 1)) > "$SOAK_TEST_COUNTER"; '
    'test -f committed.txt && ! test -f uncommitted.txt; '
    'mkdir -p runs/tiny-moe-cpu; '
    'echo "{\\"rollout_id\\": 0, \\"rollout/raw_reward\\": 0.25}" > runs/tiny-moe-cpu/metrics.jsonl; '
    'echo "{\\"rollout_id\\": 1, \\"rollout/raw_reward\\": 0.95, \\"eval/toy\\": 0.97}" >> runs/tiny-moe-cpu/metrics.jsonl; '
    'if [ "$n" -eq 1 ]; then echo "BOOM in run 2"; exit 3; fi'
)


@pytest.fixture
def scratch_repo(repo_root, tmp_path):
    repo = tmp_path / "repo"
    (repo / "tools").mkdir(parents=True)
    shutil.copy(repo_root / "tools" / "soak.sh", repo / "tools" / "soak.sh")
    (repo / "committed.txt").write_text("x\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "init"], check=True)
    (repo / "uncommitted.txt").write_text("not in HEAD\n")
    return repo


def _soak(repo, tmp_path, *args, **env):
    full = {**os.environ, "SOAK_DIR": str(tmp_path / "soak"), "SOAK_COMMAND": STUB,
            "SOAK_TEST_COUNTER": str(tmp_path / "counter"), **env}
    return subprocess.run(["bash", str(repo / "tools" / "soak.sh"), *args], env=full, capture_output=True,
                          text=True, timeout=120)


def test_counts_passes_reports_metrics_and_the_first_failure(scratch_repo, tmp_path):
    out = _soak(scratch_repo, tmp_path, "3")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "[soak] 2/3 passed" in out.stdout
    assert "run 1/3: pass in" in out.stdout and "run 2/3: FAIL (exit 3)" in out.stdout
    assert "rollouts=2 best_reward=0.950 last_eval=0.970" in out.stdout
    assert "first failure:" in out.stdout and "BOOM in run 2" in out.stdout.split("first failure:")[1]
    soak = tmp_path / "soak"
    assert not (soak / "run1").exists() and (soak / "run2").is_dir()  # failing clone kept
    assert (soak / "run1.log").is_file()


def test_all_passing_exits_zero(scratch_repo, tmp_path):
    (tmp_path / "counter").write_text("5\n")  # past the failing run
    out = _soak(scratch_repo, tmp_path, "1", SOAK_KEEP="1")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "[soak] 1/1 passed" in out.stdout and (tmp_path / "soak" / "run1").is_dir()


@pytest.mark.parametrize("bad", [[], ["0"], ["x"], ["1", "2"]])
def test_bad_count_is_a_usage_error(scratch_repo, tmp_path, bad):
    out = _soak(scratch_repo, tmp_path, *bad)
    assert out.returncode == 2 and "usage" in out.stderr
