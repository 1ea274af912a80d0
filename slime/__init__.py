"""slime: RL post-training for large language models (megatron-core training, SGLang rollout, Ray placement)."""

__version__ = "0.1.0"
