"""Packaging for slime. Heavy stacks are extras so a laptop can install only what it runs."""

from setuptools import find_packages, setup

EXTRAS = {
    # The CPU build of torch that CI and laptops use; GPU clusters bring their own CUDA torch.
    "cpu": ["torch==2.13.0"],
    # psutil: megatron's default checkpoint writer needs it (its forked writer dies silently without it)
    "megatron": ["megatron-core>=0.16", "psutil"],
    # Client side of SGLang: the router runs anywhere; sglang itself only on GPU nodes.
    "router": ["sglang-router>=0.3.2"],
    "sglang": ["sglang-router>=0.3.2", "sglang"],
    "logging": ["wandb", "tensorboard"],
    "dev": ["pytest>=8", "pytest-timeout"],
    # Pure-Python packages that sglang imports at load, for the conformance tests that run our
    # payloads through sglang's own code on CPU (sglang itself: tests/conformance/releases.py).
    "conformance": ["orjson", "pybase64", "msgspec", "pyzmq", "ipython", "pillow", "dill", "apache-tvm-ffi",
                    "sentencepiece", "compressed-tensors", "gguf", "openai", "partial-json-parser", "einops"],
}
EXTRAS["all-cpu"] = sorted({d for k in ("cpu", "megatron", "router", "logging", "dev", "conformance") for d in EXTRAS[k]})

setup(
    name="slime",
    version="0.1.0",
    description="RL post-training framework for large language models, mixture-of-experts first",
    packages=find_packages(include=["slime", "slime.*"]),
    package_data={"slime.utils.arguments": ["sglang_server_args*.json"]},
    python_requires=">=3.10",
    install_requires=[
        "torch>=2.6",
        "numpy",
        "transformers>=4.51",
        "tokenizers",
        "safetensors",
        "ray[default]>=2.40",
        "aiohttp",
        "requests",
        "fastapi",
        "uvicorn",
        # the local engine's HTTP stack (uvicorn picks them up), as SGLang's server uses uvloop
        "uvloop; sys_platform != 'win32'",
        "httptools",
        "pyarrow",
        "sympy",
        "matplotlib",
        "tqdm",
        "pyyaml",
    ],
    extras_require=EXTRAS,
)
