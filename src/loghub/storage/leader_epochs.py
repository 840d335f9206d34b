"""The leader-epoch file of a shard log: the sequence at which each leader epoch began.

Byte layout of ``leader-epochs`` in the shard's directory: ASCII text, like Kafka's
``leader-epoch-checkpoint``, with a checksum line:

    loghub-leader-epochs 1        name and format version of this file
    2                             number of entries
    0 0                           epoch, first sequence appended in that epoch
    3 1200                        (both strictly increasing from one entry to the next)
    crc32c 1a2b3c4d               CRC32C (8 hex digits) of every byte before this line

Why: replication (followers fetching from a leader, as in Kafka) cuts a follower's log where
its epoch lineage leaves the leader's (KIP-101, KIP-279), which needs "where does epoch e
end" without walking records. Every record header carries the epoch it was appended in; this
file indexes where those epochs change, as the offset index does positions.

Who writes it: the shard log's writer, when an append carries an epoch that the last entry
does not (once per epoch, never per batch), before the records of that epoch are written,
so every durable record's epoch has its entry. Atomically: a temporary file, fsync, rename
over the old one, fsync of the directory; a reader sees the old list or the new one.

After a crash: on open, entries at or past the log's end (their records never became
durable) are dropped and entries before its beginning (retention) fold into one at the
beginning. A file that fails its checks (checksum, shape, a format this code does not know),
or is missing while the log holds records, is rebuilt from the record headers and written
again: the headers are the truth and this file a cache of them, so damage here never stops
a shard. The rebuild walks the headers of format-2 segments; format-1 segments (written
before epochs were kept) hold epoch 0 only, so a data directory from before needs no walk.

Thread-safety: pure functions over a list and a directory; the shard log calls them with the
writer role held.
"""

from __future__ import annotations

import os
from pathlib import Path

import crc32c

from loghub.storage._files import fsync_directory, read_whole_file, write_fully

__all__ = [
    "LEADER_EPOCHS_FILE_NAME",
    "EpochEntry",
    "decode_leader_epochs",
    "encode_leader_epochs",
    "fit_to_log",
    "merge_epoch_starts",
    "read_leader_epochs",
    "write_leader_epochs",
]

LEADER_EPOCHS_FILE_NAME = "leader-epochs"
_TEMPORARY_SUFFIX = ".tmp"
_NAME_LINE = "loghub-leader-epochs 1"
_FILE_MODE = 0o644
_U32_MAX = 2**32 - 1
_U64_MAX = 2**64 - 1

# (leader epoch, first sequence appended in it)
EpochEntry = tuple[int, int]


def encode_leader_epochs(entries: list[EpochEntry]) -> bytes:
    assert _well_formed(entries), entries
    lines = [_NAME_LINE, str(len(entries))]
    lines += [f"{epoch} {start_seq}" for epoch, start_seq in entries]
    body = ("\n".join(lines) + "\n").encode("ascii")
    return body + f"crc32c {crc32c.crc32c(body):08x}\n".encode("ascii")


def decode_leader_epochs(data: bytes) -> list[EpochEntry] | None:
    """The entries, or None when the bytes fail any check (the caller rebuilds)."""
    body, _, trailer = data.rstrip(b"\n").rpartition(b"\n")
    body += b"\n"
    if trailer != f"crc32c {crc32c.crc32c(body):08x}".encode("ascii"):
        return None
    try:
        lines = body.decode("ascii").splitlines()
    except UnicodeDecodeError:
        return None
    if len(lines) < 2 or lines[0] != _NAME_LINE or not lines[1].isdigit():
        return None
    if int(lines[1]) != len(lines) - 2:
        return None
    entries: list[EpochEntry] = []
    for line in lines[2:]:
        fields = line.split(" ")
        if len(fields) != 2 or not all(field.isdigit() for field in fields):
            return None
        entries.append((int(fields[0]), int(fields[1])))
    return entries if _well_formed(entries) else None


def read_leader_epochs(directory: Path) -> tuple[list[EpochEntry] | None, bool]:
    """(entries or None, whether the file exists): None with True means it is damaged."""
    data = read_whole_file(directory / LEADER_EPOCHS_FILE_NAME)
    if data is None:
        return None, False
    return decode_leader_epochs(data), True


def write_leader_epochs(directory: Path, entries: list[EpochEntry]) -> None:
    """Replaces the file atomically and durably (tmp, fsync, rename, directory fsync)."""
    path = directory / LEADER_EPOCHS_FILE_NAME
    temporary = directory / (LEADER_EPOCHS_FILE_NAME + _TEMPORARY_SUFFIX)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
    fd = os.open(temporary, flags, _FILE_MODE)
    try:
        write_fully(fd, encode_leader_epochs(entries))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, path)
    fsync_directory(directory)


def merge_epoch_starts(entries: list[EpochEntry], starts: list[EpochEntry]) -> list[EpochEntry]:
    """``entries`` followed by the epoch changes of ``starts`` (in log order) that begin a
    newer epoch; an older or equal epoch is no change (epochs never go back in a log). An
    entry left with no record (its batch failed) gives way to the next one, as in Kafka."""
    merged = list(entries)
    for epoch, start_seq in starts:
        if merged and epoch <= merged[-1][0]:
            continue
        while merged and merged[-1][1] >= start_seq:  # an epoch that appended nothing
            merged.pop()
        merged.append((epoch, start_seq))
    return merged


def fit_to_log(entries: list[EpochEntry], begin_seq: int, end_seq: int) -> list[EpochEntry]:
    """The entries that describe records of [begin_seq, end_seq): those at or past the end
    are dropped, those before the beginning fold into one entry at the beginning."""
    fitted = list(entries)
    while len(fitted) > 1 and fitted[1][1] <= begin_seq:
        fitted.pop(0)
    if fitted and fitted[0][1] < begin_seq:
        fitted[0] = (fitted[0][0], begin_seq)
    return [(epoch, start_seq) for epoch, start_seq in fitted if start_seq < end_seq]


def _well_formed(entries: list[EpochEntry]) -> bool:
    for index, (epoch, start_seq) in enumerate(entries):
        if not (0 <= epoch <= _U32_MAX and 0 <= start_seq <= _U64_MAX):
            return False
        if index and not (epoch > entries[index - 1][0] and start_seq > entries[index - 1][1]):
            return False
    return True
