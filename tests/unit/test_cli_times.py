"""The one time syntax of the admin commands: epoch seconds, ISO 8601, relative to now."""

from __future__ import annotations

import pytest
import typer

from loghub.cli_admin import parse_time_s, start_position

NOW_S = 1_764_039_600.0  # 2025-11-25T03:00:00Z


@pytest.mark.parametrize(
    ("text", "expected_s"),
    [
        ("1700000000", 1_700_000_000.0),
        ("1700000000.5", 1_700_000_000.5),
        ("now", NOW_S),
        ("-30s", NOW_S - 30),
        ("-15m", NOW_S - 900),
        ("-2h", NOW_S - 7200),
        ("-1d", NOW_S - 86_400),
        ("2025-11-25T03:00:00Z", NOW_S),
        ("2025-11-25T04:00:00+01:00", NOW_S),
        ("2025-11-25T03:00:00", NOW_S),  # no offset: UTC, not the machine's zone
        ("2025-11-25", NOW_S - 3 * 3600),
    ],
)
def test_every_spelling_gives_epoch_seconds(text: str, expected_s: float) -> None:
    assert parse_time_s(text, NOW_S) == expected_s


@pytest.mark.parametrize("text", ["yesterday", "15m", "-15x", "+2h", "", "-h"])
def test_anything_else_is_a_usage_error_naming_the_forms(text: str) -> None:
    with pytest.raises(typer.BadParameter, match="epoch seconds, ISO 8601"):
        parse_time_s(text, NOW_S)


def test_start_position_keeps_begin_and_end_and_truncates_times() -> None:
    assert start_position("begin") == "begin"
    assert start_position("end") == "end"
    assert start_position("1700000000.9") == "1700000000"


def test_consume_takes_every_time_spelling_and_refuses_others() -> None:
    """`loghub consume --from` uses the same parser as the admin commands."""
    from typer.testing import CliRunner

    from loghub.cli import app

    runner = CliRunner()
    bad = runner.invoke(app, ["consume", "logs", "-p", "web", "-g", "g", "--from", "yesterday"])
    assert bad.exit_code == 2
    assert "not a time" in bad.output


def test_consume_from_turns_any_time_into_epoch_seconds() -> None:
    import time

    from loghub.consumer.cli import _start_position

    assert _start_position("begin") == "begin"
    assert _start_position("end") == "end"
    assert _start_position("2026-11-25T00:00:00Z") == "1795564800"
    assert abs(int(_start_position("-15m")) - (time.time() - 900)) < 5
