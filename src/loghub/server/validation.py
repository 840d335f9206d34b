"""Checking PutLogs bodies, in the server process.

A PutLogs body is stored as received, but first it must be proven a complete LogGroup:
decompressed to the size it claims, walked, every required field present (other clients,
the Java and Go SDKs among them, refuse a whole pull reply that holds one incomplete group),
and within the limits on logs per group.

The walk is ``loghub.wire.logcheck.count_logs``: one pass over the bytes that builds no
message and gives the protobuf runtime's verdict. Compiled, it takes well under the 100 ns a
log of 200 B that the protobuf parse and its required-field check took several times over,
so the check runs where the body already is, in the calling thread: no worker processes, no
copies of the body to them, no first-request stall while they start, nothing to outlive a
killed server. For bodies of 64 KiB and more the compiled walk releases the GIL, and lz4 and
zstd do while they decompress, so the event loop and the other request threads go on while a
large body is checked; small bodies keep the GIL, which they would spend longer handing over
and taking back than checking.

The body is decompressed once, and the raw bytes that were checked are the ones returned.

Thread-safety: ``checked_raw`` may be called from many threads at once (the checker holds no
mutable state).
"""

from __future__ import annotations

from loghub.errors import PostBodyInvalid, PostBodyTooLarge
from loghub.server.config import Limits
from loghub.wire.compression import decompress
from loghub.wire.logcheck import count_logs

__all__ = ["BodyChecker"]


def _check_raw(raw: bytes, limits: Limits) -> int:
    count = count_logs(raw)
    if not count:
        raise PostBodyInvalid("a log group must hold at least one log")
    if count > limits.logs_per_group_max:
        raise PostBodyTooLarge(
            f"a log group holds {count} logs; at most {limits.logs_per_group_max} are allowed"
        )
    return count


class BodyChecker:
    """The server's check of PutLogs bodies under its limits."""

    def __init__(self, limits: Limits) -> None:
        self._limits = limits

    def checked_raw(
        self, compress_type: str | None, body: bytes, raw_size: int | None
    ) -> tuple[bytes, int]:
        """The decompressed body, once proven a complete, non-empty LogGroup within the
        limits, and its log count (the check counts them anyway; the ingest metrics report
        it). Raises PostBodyInvalid, PostBodyTooLarge or InvalidCompressType."""
        raw = decompress(compress_type, body, raw_size, self._limits.raw_body_bytes_max)
        return raw, _check_raw(raw, self._limits)

    def close(self) -> None:
        """Nothing to release; kept so that the service closes every part the same way."""
