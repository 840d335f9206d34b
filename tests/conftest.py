"""Fixtures shared by every test directory."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from postgres import PostgresNotInstalled, find_postgres_bin, running_postgres


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
