"""Backends: the Megatron trainer, the SGLang launcher and the local SGLang-compatible engine."""
