"""The tool sandbox: hostile code (an endless loop, a memory bomb, a fork bomb, a write outside its
folder, a socket) ends with an error, leaves nothing behind on the host, and the next run works."""

import asyncio
import socket
import tempfile
from pathlib import Path

import pytest

from slime.rollout.tools.sandbox import SYSTEM_DIRS, WORKDIR, Sandbox, SandboxUnavailableError


@pytest.fixture(scope="module")
def sandbox():
    try:
        box = Sandbox(memory_bytes=128 << 20, max_processes=8, max_output_bytes=2048, max_concurrency=2)
    except SandboxUnavailableError as exc:
        pytest.skip(str(exc))
    probe = asyncio.run(box.run("print('up')", timeout=3))
    if probe.error and "unavailable" in probe.error:
        pytest.skip(probe.error)
    return box


def run(box, code, timeout=3.0):
    return asyncio.run(box.run(code, timeout=timeout))


def processes_of(uid: int) -> list[int]:
    """Host pids whose real uid is `uid`."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            status = (entry / "status").read_text()
        except (OSError, ValueError):
            continue
        for line in status.splitlines():
            if line.startswith("Uid:") and int(line.split()[1]) == uid:
                pids.append(int(entry.name))
    return pids


def assert_contained_then_usable(box, result):
    assert not result.ok and result.error
    assert processes_of(result.uid) == []  # every process of the run is gone
    after = run(box, "print(6 * 7)")
    assert after.ok and after.output == "42\n"


def test_plain_run_has_a_private_folder_and_no_secrets(sandbox, monkeypatch):
    monkeypatch.setenv("SLIME_API_KEY", "secret-key")
    code = ("import os\nopen('note', 'w').write('kept')\nprint(os.getcwd(), open('note').read(), "
            "os.environ.get('SLIME_API_KEY'), os.getuid() != 0)")
    result = run(sandbox, code)
    assert result.ok and result.exit_code == 0 and result.output == f"{WORKDIR} kept None True\n"
    again = run(sandbox, "import os; print(os.listdir('.'))")  # a fresh folder every run
    assert again.output == "[]\n"


def test_endless_loop_times_out(sandbox):
    result = run(sandbox, "while True:\n    pass", timeout=1.0)
    assert result.timed_out and "timed out after 1 s" in result.error
    assert_contained_then_usable(sandbox, result)


def test_memory_bomb_hits_the_memory_limit(sandbox):
    result = run(sandbox, "chunks = []\nwhile True:\n    chunks.append(bytearray(10**7))")
    assert "MemoryError" in result.error and not result.timed_out
    assert_contained_then_usable(sandbox, result)


def test_fork_bomb_is_contained(sandbox):
    result = run(sandbox, "import os\nwhile True:\n    os.fork()")
    assert "BlockingIOError" in result.error or result.timed_out
    assert_contained_then_usable(sandbox, result)


def test_sleeping_children_die_with_the_run(sandbox):
    """Children that outlive their parent (detached, new session) are killed with the namespace."""
    code = ("import os, subprocess\nfor _ in range(3):\n"
            "    subprocess.Popen(['sleep', '60'], start_new_session=True)\nos._exit(3)")
    result = run(sandbox, code)
    assert result.exit_code == 3 and result.error.startswith("exit code 3")
    assert_contained_then_usable(sandbox, result)


def test_a_new_session_does_not_outlive_the_timeout(sandbox):
    """Code that leaves the process group (setsid) and sleeps is still killed at the timeout."""
    result = run(sandbox, "import os, time\nos.setsid()\ntime.sleep(60)", timeout=1.0)
    assert result.timed_out
    assert_contained_then_usable(sandbox, result)


@pytest.fixture
def world_writable_dir():
    """A folder any user may write to, outside /tmp (which the sandbox replaces anyway)."""
    shared = Path(tempfile.mkdtemp(dir="/var/tmp"))
    shared.chmod(0o777)
    yield shared
    for child in shared.iterdir():
        child.unlink()
    shared.rmdir()


def test_writes_outside_the_folder_are_refused(sandbox, tmp_path, world_writable_dir):
    for target in (world_writable_dir / "escaped", tmp_path / "escaped", Path("/escaped"), Path("/etc/escaped")):
        result = run(sandbox, f"open({str(target)!r}, 'w').write('x')")
        assert "Error" in result.error, result.output
        assert not target.exists()
        assert_contained_then_usable(sandbox, result)
    assert "Read-only file system" in run(sandbox, "open('/usr/escaped', 'w')").error
    seen = run(sandbox, "import os; print(sorted(os.listdir('/')), os.path.exists('/work'), os.path.exists('/root'))")
    assert seen.ok and seen.output.endswith(" False False\n")  # the system folders only
    assert set(eval(seen.output.rsplit(" ", 2)[0])) <= {*SYSTEM_DIRS, "dev", "proc", "tmp"}


def test_no_network(sandbox, world_writable_dir):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.settimeout(0.2)
        port = listener.getsockname()[1]
        result = run(sandbox, f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)")
        assert "Network is unreachable" in result.error
        with pytest.raises(socket.timeout):
            listener.accept()  # nothing reached the host
    assert_contained_then_usable(sandbox, result)
    path = world_writable_dir / "host.sock"  # a Unix socket any user may connect to on the host
    with socket.socket(socket.AF_UNIX) as host:
        host.bind(str(path))
        path.chmod(0o777)
        host.listen()
        code = f"import socket\nsocket.socket(socket.AF_UNIX).connect({str(path)!r})"
        assert "No such file or directory" in run(sandbox, code).error


def test_output_is_bounded_and_concurrent_runs_work(sandbox):
    big = run(sandbox, "print('x' * 100000)")
    assert big.ok and big.truncated and len(big.output) == 2048

    async def several():
        return await asyncio.gather(*(sandbox.run(f"print({i} ** 2)", timeout=3) for i in range(3)))

    assert [r.output for r in asyncio.run(several())] == ["0\n", "1\n", "4\n"]
    assert run(sandbox, "raise SystemExit(5)").error == "exit code 5: no output"
    assert "ZeroDivisionError" in run(sandbox, "1 / 0").text()
    assert run(sandbox, "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)").error == "killed by SIGKILL"
