"""The checks under against_sglang/ import a real sglang release: they run only inside the per-release
pytest processes that test_sglang_releases.py starts (SLIME_SGLANG_VERSION set)."""

import os

collect_ignore = [] if os.environ.get("SLIME_SGLANG_VERSION") else ["against_sglang"]
