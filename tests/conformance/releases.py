"""The sglang releases the conformance tier judges us against, and their install.

SGLang's server needs CUDA, but its Python code (server-args parser, process-group helper,
serializer, tensor bucket, request dataclasses) imports on CPU. Each release is installed without
its GPU dependencies into its own folder under `$SLIME_CACHE_DIR` (default `~/.cache/slime`),
outside the clone and keyed by version, so later runs and later clones reuse it:

    sglang/<version>/                 sglang (--no-deps) and the pins that release needs
    triton-<v>/, torchvision-<v>/     shared by every release (sglang imports both at load)

The pure-Python packages sglang imports at load come with slime's `conformance` extra
(setup.py). `scripts/test.sh` runs this file before pytest; `test_sglang_releases.py` runs the
checks under `tests/conformance/against_sglang/` once per release with `pythonpath(version)`.

Usage: `python tests/conformance/releases.py` (installs what is missing; idempotent).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

# version -> extra requirements installed (--no-deps) into that release's folder, shadowing the venv.
RELEASES: dict[str, tuple[str, ...]] = {
    "0.5.23": (),  # the newest release
    # slime's image is built on 0.5.15.post1; it pins transformers 5.12.1, which wants older
    # tokenizers and huggingface-hub than the venv's.
    "0.5.15.post1": ("transformers==5.12.1", "tokenizers==0.22.2", "huggingface-hub>=1.5,<2"),
}
TRITON = "triton==3.9.0"
# The wheel built for torch 2.13. Its compiled ops are a CUDA build that cannot load beside the CPU
# torch; sglang only needs its pure-Python transforms (see against_sglang/conftest.py).
TORCHVISION = "torchvision==0.28.0"


def cache_dir() -> Path:
    """Root of the installed releases: `$SLIME_CACHE_DIR` or `~/.cache/slime`."""
    return Path(os.environ.get("SLIME_CACHE_DIR") or Path.home() / ".cache" / "slime")


def _folder(requirement: str) -> Path:
    name, version = requirement.split("==")
    return cache_dir() / f"{name}-{version}"


def release_dir(version: str) -> Path:
    """Folder of sglang `version`."""
    return cache_dir() / "sglang" / version


def pythonpath(version: str) -> list[str]:
    """PYTHONPATH entries (first wins) that make sglang `version` importable beside the venv."""
    return [str(release_dir(version)), str(_folder(TRITON)), str(_folder(TORCHVISION))]


def is_installed(version: str) -> bool:
    """Whether every folder of `pythonpath(version)` finished installing."""
    return all((Path(p) / ".complete").is_file() for p in pythonpath(version))


def _install(target: Path, requirements: list[str]) -> None:
    """pip install --no-deps --target; the folder appears only once the install succeeded."""
    if (target / ".complete").is_file():
        return
    print(f"[slime] installing {' '.join(requirements)} into {target}", flush=True)
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    "--no-deps", "--target", str(partial), *requirements], check=True)
    (partial / ".complete").touch()
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)


def install_all() -> None:
    """Install every release of `RELEASES` (and triton, torchvision) that is not there yet."""
    _install(_folder(TRITON), [TRITON])
    _install(_folder(TORCHVISION), [TORCHVISION])
    for version, pins in RELEASES.items():
        release_dir(version).parent.mkdir(parents=True, exist_ok=True)
        _install(release_dir(version), [f"sglang=={version}", *pins])


if __name__ == "__main__":
    install_all()
