"""Generated protobuf code for the LogHub log model (do not edit ``loghub_pb2.*`` by hand).

The messages live in the protobuf package ``loghub.wire`` so that they can share a process
with the official SDK, whose own ``log_logs.proto`` defines the same names at top level.
"""

# The generated module builds its classes at run time, and protobuf ships no type stubs,
# so mypy sees neither the names nor their types: to it they are Any.
from loghub.wire.proto.loghub_pb2 import (  # type: ignore[attr-defined]
    Log,
    LogGroup,
    LogGroupList,
    LogTag,
)

__all__ = ["Log", "LogGroup", "LogGroupList", "LogTag"]
