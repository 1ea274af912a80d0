"""Runnable examples (importable by dotted path from the repository root)."""
