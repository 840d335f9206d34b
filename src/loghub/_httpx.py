"""``httpx``, imported without its command-line client.

httpx 0.28 imports its own command-line client (``httpx._main``: click, rich, pygments) on
``import httpx`` whenever those packages are installed, and LogHub's own CLI (typer) installs
them. Every new process that imports LogHub's client paid for it: 50-100 ms here, about a
quarter of ``python -c "import loghub.client"`` (0.24 s before, 0.19 s after), in each
consumer process, each Spark Python worker (the first query of a session starts four: data
source lookup, schema, planning, then the readers) and each script.

So the module is imported with a stand-in for ``httpx._main`` in ``sys.modules``; the
stand-in is removed right after, and ``httpx.main`` (the ``httpx`` command's entry point)
loads the real client when called. Nothing else of httpx changes. A process that imported
httpx before LogHub keeps what it has. (The same change is proposed upstream: httpx PR 3547,
"Do CLI import in __main__, not __init__".)

Use ``from loghub._httpx import httpx`` instead of ``import httpx``.
"""

from __future__ import annotations

import sys
import types
from typing import Any

__all__ = ["httpx"]


def _command_line(*args: Any, **kwargs: Any) -> Any:
    """``httpx.main``: the real command-line client, imported on first use."""
    from httpx._main import main

    return main(*args, **kwargs)


_stand_in = types.ModuleType("httpx._main", "stands in for httpx's CLI while httpx is imported")
_stand_in.main = _command_line  # type: ignore[attr-defined]
if "httpx" not in sys.modules:
    sys.modules.setdefault("httpx._main", _stand_in)
try:
    import httpx as httpx  # noqa: E402  (after the stand-in, on purpose)
finally:
    if sys.modules.get("httpx._main") is _stand_in:
        del sys.modules["httpx._main"]
