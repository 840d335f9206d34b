#!/bin/sh
# Regenerate the protobuf code of loghub.wire from src/loghub/wire/proto/loghub.proto.
# Uses the protoc bundled with grpcio-tools (pinned in pyproject so that the generated code
# matches the protobuf runtime); tests/unit/test_wire_proto.py checks the result is current.
set -eu
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
"$PYTHON" -m grpc_tools.protoc -I src/loghub/wire/proto \
    --python_out=src/loghub/wire/proto loghub.proto
