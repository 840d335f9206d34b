"""The keys file: the old form (id: secret) and grants (projects, read or write access);
errors that name the file and the key id but never a secret."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loghub.errors import ParameterInvalid
from loghub.server.auth import needs_write
from loghub.server.config import KeyGrant, load_key_grants, load_keys

SECRET = "s3cret-never-shown"


def _file(tmp_path: Path, content: object) -> Path:
    path = tmp_path / "keys.json"
    path.write_text(json.dumps(content))
    return path


def test_the_old_form_still_gives_keys_that_may_do_everything(tmp_path: Path) -> None:
    path = _file(tmp_path, {"ak": "sk"})
    assert load_keys(path, environ={}) == {"ak": "sk"}
    assert load_key_grants(path) == {}


def test_grants_limit_projects_and_access(tmp_path: Path) -> None:
    path = _file(
        tmp_path,
        {
            "admin": "a",
            "reader": {"secret": "r", "projects": ["Web", "api"], "access": "read"},
            "writer": {"secret": "w", "projects": ["*"]},
        },
    )
    assert load_keys(path, environ={}) == {"admin": "a", "reader": "r", "writer": "w"}
    grants = load_key_grants(path)
    assert grants == {
        "reader": KeyGrant(frozenset({"web", "api"}), "read"),
        "writer": KeyGrant(frozenset({"*"}), "write"),
    }
    reader = grants["reader"]
    assert reader.allows("web", write=False) and not reader.allows("web", write=True)
    assert not reader.allows("other", write=False)
    assert grants["writer"].allows("anything", write=True)


@pytest.mark.parametrize(
    "entry",
    [
        {"secret": SECRET, "access": "admin"},
        {"secret": SECRET, "projects": "web"},
        {"secret": SECRET, "projects": [""]},
        {"secret": SECRET, "role": "x"},
        {"secret": ""},
        {"projects": ["web"]},
        "",
        5,
    ],
)
def test_a_bad_entry_is_refused_without_showing_the_secret(tmp_path: Path, entry: object) -> None:
    path = _file(tmp_path, {"key-1": entry})
    with pytest.raises(ParameterInvalid) as raised:
        load_keys(path, environ={})
    assert "key-1" in str(raised.value) or "key" in str(raised.value)
    assert SECRET not in str(raised.value)


@pytest.mark.parametrize(
    ("method", "path", "write"),
    [
        ("GET", "/logstores/ls/shards/0", False),
        ("POST", "/logstores/ls/shards/0", True),
        ("POST", "/", True),
        ("DELETE", "/logstores/ls", True),
        ("POST", "/logstores/ls/consumergroups", False),
        ("POST", "/logstores/ls/consumergroups/cg", False),
        ("PUT", "/logstores/ls/consumergroups/cg", False),
        ("DELETE", "/logstores/ls/consumergroups/cg", True),
        ("PUT", "/logstores/ls", True),
    ],
)
def test_what_counts_as_writing(method: str, path: str, write: bool) -> None:
    assert needs_write(method, [p for p in path.split("/") if p]) is write
