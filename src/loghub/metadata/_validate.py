"""Rules for names and logstore settings, checked before anything is written.

The names follow the hosted service's rules, so a project or logstore made here can be made
there too. Bad settings raise ``LogStoreInfoInvalid``, the code the SDK expects for a bad
create or update body. Values are type-checked as well, because they come from JSON.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from loghub.errors import LogStoreInfoInvalid, ParameterInvalid
from loghub.metadata.models import LogstoreSpec

__all__ = [
    "description_chars_max",
    "max_split_shard_max",
    "shards_per_logstore_max",
    "ttl_days_max",
    "validate_description",
    "validate_project_name",
    "validate_spec",
]

# Each shard is a directory and a writer; this bounds what one request can make us create.
shards_per_logstore_max = 1024
max_split_shard_max = 1024
ttl_days_max = 3650
description_chars_max = 1024

_PROJECT_NAME = re.compile(r"[a-z0-9][a-z0-9-]{1,61}[a-z0-9]")
_LOGSTORE_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{1,61}[a-z0-9]")


def validate_project_name(name: str) -> None:
    if not isinstance(name, str) or _PROJECT_NAME.fullmatch(name) is None:
        raise ParameterInvalid(
            f"project name {name!r} must be 3 to 63 characters of a-z, 0-9 and '-', "
            "starting and ending with a letter or digit"
        )


def validate_description(description: str) -> None:
    if not isinstance(description, str) or len(description) > description_chars_max:
        raise ParameterInvalid(
            f"description must be a string of at most {description_chars_max} characters"
        )


def validate_spec(spec: LogstoreSpec) -> None:
    if not isinstance(spec.name, str) or _LOGSTORE_NAME.fullmatch(spec.name) is None:
        raise LogStoreInfoInvalid(
            f"logstore name {spec.name!r} must be 3 to 63 characters of a-z, 0-9, '_' and "
            "'-', starting and ending with a letter or digit"
        )
    _check_int("ttl", spec.ttl_days, 1, ttl_days_max)
    _check_int("shardCount", spec.shard_count, 1, shards_per_logstore_max)
    _check_int("maxSplitShard", spec.max_split_shard, 1, max_split_shard_max)
    for key, flag in (
        ("autoSplit", spec.auto_split),
        ("appendMeta", spec.append_meta),
        ("enable_tracking", spec.enable_tracking),
    ):
        if not isinstance(flag, bool):
            raise LogStoreInfoInvalid(f"{key} must be true or false, got {flag!r}")
    for key, text in (("telemetryType", spec.telemetry_type), ("mode", spec.mode)):
        if not isinstance(text, str) or len(text) > 63:
            raise LogStoreInfoInvalid(f"{key} must be a string of at most 63 characters")
    if not isinstance(spec.extra, Mapping) or not all(isinstance(k, str) for k in spec.extra):
        raise LogStoreInfoInvalid("logstore settings must have string keys")


def _check_int(key: str, value: Any, low: int, high: int) -> None:
    # bool is an int in Python, but `"ttl": true` is not a number of days.
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise LogStoreInfoInvalid(f"{key} must be an integer from {low} to {high}, got {value!r}")
