"""Runs the SGLang conformance checks (tests/conformance/against_sglang/) against every release of
`releases.RELEASES`, one pytest process per release with that release first on PYTHONPATH.

A release that is not installed fails here (run `python tests/conformance/releases.py` or
`bash scripts/test.sh`, which installs them): the tier must not pass by checking nothing.
"""

import os
import subprocess
import sys

import pytest

from tests.conformance import releases

CHECKS = os.path.join(os.path.dirname(__file__), "against_sglang")


@pytest.mark.parametrize("version", sorted(releases.RELEASES))
def test_sglang_release(version, repo_root):
    assert releases.is_installed(version), (
        f"sglang {version} is not installed under {releases.cache_dir()}: "
        "run `python tests/conformance/releases.py` (scripts/test.sh does)")
    env = dict(os.environ, SLIME_SGLANG_VERSION=version,
               PYTHONPATH=os.pathsep.join([*releases.pythonpath(version), str(repo_root),
                                           os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    proc = subprocess.run([sys.executable, "-m", "pytest", CHECKS, "-q", "-p", "no:cacheprovider",
                           "--no-header", "-rfEs"], cwd=repo_root, env=env, capture_output=True,
                          text=True, timeout=1200)
    tail = (proc.stdout + proc.stderr)[-12000:]
    assert proc.returncode == 0, f"conformance checks against sglang {version} failed:\n{tail}"
    assert " passed" in proc.stdout, f"no conformance check ran against sglang {version}:\n{tail}"
