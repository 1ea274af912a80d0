"""A small SGLang-compatible HTTP engine for CPU and small GPUs (same endpoints and fields as SGLang)."""
