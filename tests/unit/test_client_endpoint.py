"""LogHubClient refuses a malformed endpoint or signing setting with ParameterInvalid (a
clear error in LogHub's tree), not an assertion that `python -O` would skip."""

from __future__ import annotations

import pytest

from loghub.client import LogHubClient
from loghub.errors import ParameterInvalid


@pytest.mark.parametrize("endpoint", [":8080", "ftp://host", "http://", "host:port", "h:99999999"])
def test_a_malformed_endpoint_is_refused(endpoint: str) -> None:
    with pytest.raises(ParameterInvalid, match="endpoint"):
        LogHubClient(endpoint)


def test_v4_without_a_region_and_an_unknown_version_are_refused() -> None:
    with pytest.raises(ParameterInvalid, match="region"):
        LogHubClient("127.0.0.1:1", "ak", "sk", auth_version="v4")
    with pytest.raises(ParameterInvalid, match="auth_version"):
        LogHubClient("127.0.0.1:1", "ak", "sk", auth_version="v5")  # type: ignore[arg-type]


def test_good_endpoints_are_taken() -> None:
    for endpoint in ("127.0.0.1:8080", "http://localhost", "https://[::1]:8443"):
        LogHubClient(endpoint).close()
