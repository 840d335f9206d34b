"""Fixtures shared by every test directory."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import settings
from postgres import PostgresNotInstalled, find_postgres_bin, running_postgres

# One verdict per commit: `make test` (and a plain `pytest`) draws the same examples every run
# and ignores examples saved by earlier runs. `make test-slow` loads ``wide``: random seeds and
# 5,000 examples for the tests that ask `hypothesis_budget.examples()` for their count.
settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("wide", max_examples=5000, print_blob=True)
settings.load_profile(os.environ.get("LOGHUB_HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A SQLAlchemy URL of a database on a PostgreSQL server started for this session.

    Fails (never skips) when PostgreSQL is missing: a skipped back end is an untested one.
    """
    try:
        find_postgres_bin()
    except PostgresNotInstalled as exc:
        pytest.fail(str(exc), pytrace=False)
    with running_postgres() as url:
        yield url
