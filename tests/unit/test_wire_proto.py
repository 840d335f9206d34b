"""The generated protobuf code is current, and it lives beside the official SDK's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import loghub.wire.proto

PROTO_DIR = Path(loghub.wire.proto.__file__).parent


def test_generated_code_matches_the_proto(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{PROTO_DIR}",
            f"--python_out={tmp_path}",
            "loghub.proto",
        ],
        check=True,
        capture_output=True,
    )
    regenerated = (tmp_path / "loghub_pb2.py").read_text()
    committed = (PROTO_DIR / "loghub_pb2.py").read_text()
    assert regenerated == committed, "run scripts/gen_proto.sh and commit the result"


def test_our_messages_and_the_sdks_share_one_process() -> None:
    # The SDK registers top-level LogGroup etc. in the default descriptor pool; ours must not
    # clash with them, whichever module is imported first.
    code = (
        "import {first}, {second}\n"
        "from loghub.wire.proto import LogGroup\n"
        "from aliyun.log.proto import LogGroup as SdkLogGroup\n"
        "raw = SdkLogGroup(Topic='t').SerializeToString()\n"
        "assert LogGroup.FromString(raw).Topic == 't'\n"
    )
    for first, second in [
        ("aliyun.log", "loghub.wire.proto.loghub_pb2"),
        ("loghub.wire.proto.loghub_pb2", "aliyun.log"),
    ]:
        subprocess.run(
            [sys.executable, "-c", code.format(first=first, second=second)],
            check=True,
            capture_output=True,
        )


def test_our_messages_are_in_their_own_package() -> None:
    assert loghub.wire.proto.LogGroup.DESCRIPTOR.full_name == "loghub.wire.LogGroup"
