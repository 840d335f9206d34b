"""How many examples a property test runs: its own count in `make test` (profile ``ci``, fixed
seed), or the profile's when that is larger (``wide`` in `make test-slow`: 5,000, random)."""

from __future__ import annotations

from hypothesis import settings


def examples(ci_count: int) -> int:
    return max(ci_count, settings.default.max_examples)
