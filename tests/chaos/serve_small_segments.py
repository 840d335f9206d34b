"""`loghub serve` with small segments, so that a chaos run of a few minutes closes many
segment files (the fault driver damages closed ones). Everything else is the server's own
default; `loghub serve` has no flag for the segment size.

Usage: python serve_small_segments.py DATA_DIR PORT KEYS_FILE SEGMENT_BYTES
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from loghub.server import ServerConfig, load_keys
from loghub.server import serve as run_server


def main() -> None:
    data_dir, port, keys_file, segment_bytes = sys.argv[1:5]
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    config = ServerConfig(
        data_dir=Path(data_dir),
        port=int(port),
        keys=load_keys(Path(keys_file)),
        segment_bytes_max=int(segment_bytes),
    )
    run_server(config)


if __name__ == "__main__":
    main()
