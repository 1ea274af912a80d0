"""Tests of slime.backends.sglang_utils."""
