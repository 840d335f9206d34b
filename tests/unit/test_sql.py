"""The one SQL engine factory: the metadata database and the lease store open SQLite alike."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

from loghub._clock import SystemClock
from loghub._sql import create_engine, sqlite_busy_timeout_ms
from loghub.coordination.lease_sql import create_lease_engine
from loghub.errors import ParameterInvalid
from loghub.metadata import MetadataStore

_PRAGMAS = ("journal_mode", "synchronous", "foreign_keys", "busy_timeout")


def _pragmas(engine: sa.Engine) -> dict[str, object]:
    with engine.connect() as conn:
        return {name: conn.exec_driver_sql(f"PRAGMA {name}").scalar() for name in _PRAGMAS}


def test_metadata_and_lease_engines_open_sqlite_with_the_same_settings(tmp_path: Path) -> None:
    """Before, each store had its own copy, and the lease store's left foreign keys off."""
    metadata = MetadataStore.open(f"sqlite:///{tmp_path}/meta/meta.db", SystemClock())
    lease = create_lease_engine(f"sqlite:///{tmp_path}/leases/leases.db")
    try:
        expected = {
            "journal_mode": "wal",
            "synchronous": 2,  # FULL
            "foreign_keys": 1,
            "busy_timeout": sqlite_busy_timeout_ms,
        }
        assert _pragmas(metadata._engine) == expected
        assert _pragmas(lease) == expected
    finally:
        metadata.close()
        lease.dispose()


@pytest.mark.parametrize("purpose", ["metadata", "lease"])
def test_an_unsupported_url_is_refused_naming_its_purpose(purpose: str) -> None:
    with pytest.raises(ParameterInvalid, match=f"{purpose} URL must be sqlite://"):
        create_engine("mysql://somewhere/db", purpose)
