"""Helpers for deterministic tests, shipped so users can test their own code the same way."""

from loghub.testing.clock import FakeClock

__all__ = ["FakeClock"]
