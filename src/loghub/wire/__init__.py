"""The LogHub wire format as pure functions: no I/O, no clock (times are arguments).

Both the server and the client build on this package, so a byte on the wire means the same
thing on both sides: protobuf log groups (``logs``, and ``logcheck``, which proves bytes a
complete log group without building it), body compression (``compression``),
cursors (``cursor``), request signatures (``signing``) and error bodies (``errors``).
"""

from loghub.wire.compression import (
    COMPRESS_TYPES,
    choose_response_compression,
    compress,
    decompress,
)
from loghub.wire.cursor import SEQUENCE_MAX, decode_cursor, encode_cursor
from loghub.wire.errors import error_body, error_from_body
from loghub.wire.logs import (
    LogDict,
    LogGroupDict,
    frame_log_group,
    log_group_to_dict,
    make_log_group,
    parse_log_group,
    parse_log_group_list,
)
from loghub.wire.proto import Log, LogGroup, LogGroupList, LogTag
from loghub.wire.signing import Credentials, VerifiedRequest, sign_v1, sign_v4, verify

__all__ = [
    "COMPRESS_TYPES",
    "SEQUENCE_MAX",
    "Credentials",
    "Log",
    "LogDict",
    "LogGroup",
    "LogGroupDict",
    "LogGroupList",
    "LogTag",
    "VerifiedRequest",
    "choose_response_compression",
    "compress",
    "decode_cursor",
    "decompress",
    "encode_cursor",
    "error_body",
    "error_from_body",
    "frame_log_group",
    "log_group_to_dict",
    "make_log_group",
    "parse_log_group",
    "parse_log_group_list",
    "sign_v1",
    "sign_v4",
    "verify",
]
