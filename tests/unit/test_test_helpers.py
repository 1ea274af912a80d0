"""The suite's process helpers behave as what they replace: tests/warm_python.py as the interpreter
(argv, environment, working directory, stdio, sys.path, exit status, signals, the real interpreter
for what it does not handle) and tests/spawn_ranks.py as torch.multiprocessing.spawn (the caller's
environment, working directory and output at the call)."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.spawn_ranks import spawn_ranks
from tests.warm_python import warm_python

PROBE = """
import json, os, sys
print(json.dumps({"argv": sys.argv, "cwd": os.getcwd(), "path0": sys.path[0], "env": os.environ.get("PROBE_VAR"),
                  "pythonpath": [p for p in sys.path if p.endswith("probe-path")], "torch": "torch" in sys.modules}))
print("to stderr", file=sys.stderr)
sys.exit(int(os.environ.get("PROBE_EXIT", "0")))
"""


def _run(argv, tmp_path, stdin="", **env):
    return subprocess.run([warm_python(), *argv], cwd=tmp_path, capture_output=True, text=True, timeout=120, input=stdin,
                          env={**os.environ, "PROBE_VAR": "seen", "PYTHONPATH": str(tmp_path / "probe-path"), **env})


def test_script_runs_as_under_the_interpreter(tmp_path):
    script = tmp_path / "sub" / "probe.py"
    script.parent.mkdir()
    script.write_text(PROBE)
    proc = _run([str(script), "a", "--b"], tmp_path, PROBE_EXIT="3")
    assert proc.returncode == 3, proc.stderr
    out = json.loads(proc.stdout)
    assert out["argv"] == [str(script), "a", "--b"] and out["cwd"] == str(tmp_path)
    assert out["path0"] == str(script.parent) and out["env"] == "seen"
    assert out["pythonpath"] == [str(tmp_path / "probe-path")]
    assert proc.stderr == "to stderr\n"


def test_code_module_exceptions_and_fallback(tmp_path):
    proc = _run(["-c", "import sys; print(sys.argv)", "x"], tmp_path)
    assert proc.returncode == 0 and proc.stdout == "['-c', 'x']\n"
    proc = _run(["-c", "raise ValueError('boom')"], tmp_path)
    assert proc.returncode == 1 and proc.stderr.splitlines()[-1] == "ValueError: boom"
    assert "warm_python" not in proc.stderr  # the traceback is the script's own
    proc = _run(["-m", "json.tool", "--compact"], tmp_path, stdin='{"a": [1, 2]}')  # the caller's stdin
    assert proc.returncode == 0 and proc.stdout == '{"a":[1,2]}\n', proc.stderr
    # an option it does not handle runs the real interpreter (a new process: torch not imported)
    proc = _run(["-W", "error", "-c", "import sys; print('torch' in sys.modules)"], tmp_path)
    assert proc.returncode == 0 and proc.stdout == "False\n"
    proc = _run(["-c", "import sys; print('torch' in sys.modules)"], tmp_path, PYTHONWARNINGS="error")
    assert proc.stdout == "False\n"


def test_signals_reach_the_run(tmp_path):
    proc = subprocess.Popen([warm_python(), "-c", "import time; print('up', flush=True); time.sleep(60)"],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "up\n"
    start = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == -signal.SIGTERM and time.monotonic() - start < 30


def _rank_probe(rank, out_dir):
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump({"env": os.environ.get("PROBE_VAR"), "cwd": os.getcwd()}, f)
    print(f"rank {rank} output")


@pytest.mark.parametrize("value", ["first", "second"])  # the second call reuses the server
def test_spawn_ranks_gets_the_callers_state(tmp_path, monkeypatch, capfd, value):
    monkeypatch.setenv("PROBE_VAR", value)
    monkeypatch.chdir(tmp_path)
    spawn_ranks(_rank_probe, args=(str(tmp_path),), nprocs=2)
    for rank in range(2):
        seen = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert seen == {"env": value, "cwd": str(tmp_path)}
    out = capfd.readouterr().out
    assert "rank 0 output" in out and "rank 1 output" in out


def test_spawn_ranks_reports_a_failing_rank(tmp_path):
    with pytest.raises(Exception, match="ZeroDivisionError"):
        spawn_ranks(_fail_on_rank1, nprocs=2)


def _fail_on_rank1(rank):
    if rank == 1:
        1 / 0
    sys.exit(0)
