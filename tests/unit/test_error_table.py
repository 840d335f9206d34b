"""The error tree and the one table that maps it onto the protocol: every class has one
status and one code, the server's own faults never show their messages, storage raises only
its own classes, and every code a server can send is documented."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

from loghub import errors
from loghub.server.errors import protocol_error

ROOT = Path(__file__).resolve().parents[2]
CLASSES = [
    cls
    for name in errors.__all__
    if inspect.isclass(cls := getattr(errors, name)) and issubclass(cls, errors.LogHubError)
]


def _instance(cls: type[errors.LogHubError]) -> errors.LogHubError:
    if cls is errors.RecordsLostError:
        return cls("/data/shards/x lost", first_seq=1, end_seq=2)
    if cls is errors.ServerError:
        return cls("SomeCode", "/data/shards/x: details")
    return cls("/data/shards/x: details")


def _raised(cls: type[errors.LogHubError]) -> bool:
    """A leaf of the tree: the classes code raises (branches only group them)."""
    return not any(other is not cls and issubclass(other, cls) for other in CLASSES)


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_every_class_has_one_status_and_code(cls: type[errors.LogHubError]) -> None:
    reply = protocol_error(_instance(cls))
    assert 400 <= reply.status <= 599
    assert reply.code
    if reply.internal:
        assert reply.status >= 500 and reply.code == "InternalServerError"
        assert "/data" not in reply.message


def test_client_mistakes_are_4xx_and_server_faults_hide_their_details() -> None:
    for cls in CLASSES:
        reply = protocol_error(_instance(cls))
        if issubclass(cls, errors.RequestError | errors.NotFoundError | errors.AuthError):
            assert reply.status < 500 or cls is errors.SignatureReused, cls
    for cls in (
        errors.StorageError,
        errors.CorruptSegmentError,
        errors.StorageClosedError,
        errors.DatabaseError,
        errors.IllegalTransition,
        errors.LeaseLostError,
    ):
        reply = protocol_error(_instance(cls))
        assert (reply.status, reply.internal) == (500, True), cls


def test_storage_errors_reach_the_wire_in_the_protocols_words() -> None:
    expected = {
        errors.RecordTooLargeError: (413, "PostBodyTooLarge"),
        errors.LogSealedError: (400, "ShardReadOnly"),
        errors.SequenceOutOfRangeError: (400, "InvalidCursor"),
        errors.DiskFullError: (507, "StorageFull"),
        errors.RecordsLostError: (410, "DataCorrupted"),
    }
    for cls, (status, code) in expected.items():
        reply = protocol_error(_instance(cls))
        assert (reply.status, reply.code, reply.internal) == (status, code, False)
        assert errors.error_class_for_code(code) is not None


def test_storage_raises_only_its_own_errors() -> None:
    for path in sorted((ROOT / "src/loghub/storage").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "loghub.errors":
                for alias in node.names:
                    cls = getattr(errors, alias.name)
                    assert issubclass(cls, errors.StorageError), (path.name, alias.name)


def test_every_code_a_server_sends_is_documented() -> None:
    documented = set(
        re.findall(r"^\| `(\w+)` \| (\d{3}) \|", (ROOT / "docs/protocol.md").read_text(), re.M)
    )
    for cls in CLASSES:
        if issubclass(cls, errors.ClientError) or not _raised(cls):
            continue  # raised by the client only, never sent; or a branch
        reply = protocol_error(_instance(cls))
        assert (reply.code, str(reply.status)) in documented, (cls.__name__, reply.code)


@pytest.mark.parametrize(
    "cls", [errors.ControlPlaneError, errors.FencedError, errors.NotEnoughReplicasError]
)
def test_a_cluster_whose_control_plane_or_role_moved_answers_a_retryable_503(
    cls: type[errors.LogHubError],
) -> None:
    """etcd out of reach, a role another node took since, or a shard leader short of
    in-sync replicas: over when the client asks again, so the answer is one every client
    retries, not a 500 that hides why."""
    reply = protocol_error(cls("etcd get failed: the members did not answer"))
    assert (reply.status, reply.code, reply.internal) == (503, "ServerBusy", False)
    assert "etcd" in reply.message


def test_the_drawing_in_the_protocol_doc_is_the_error_trees_docstring() -> None:
    """docs/protocol.md copies the drawing of ``loghub.errors``; a class added to one and
    not the other (as three coordination classes once were) fails here."""
    drawing = errors.__doc__.split("\n\n    LogHubError", 1)[1].split("\n\nEach layer", 1)[0]
    source = ("    LogHubError" + drawing).splitlines()
    doc = (ROOT / "docs" / "protocol.md").read_text()
    copied = doc.split("source of this drawing):\n\n```\n", 1)[1].split("\n```", 1)[0]
    assert copied.splitlines() == source
