"""Tests of the SGLang-compatible local engine."""
