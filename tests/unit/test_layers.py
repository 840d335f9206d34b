"""The layers of DESIGN.md, enforced: a module may import only from the layers below it.

Walks every module's imports with `ast`, so a new upward import fails here at once.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import loghub

SRC = Path(loghub.__file__).parent

_BASE = {"errors", "_clock", "_retry", "_times", "_lazy", "_httpx"}
# layer -> the layers it may import (besides itself)
ALLOWED: dict[str, set[str]] = {
    "__init__": _BASE,
    "errors": set(),
    "_clock": set(),
    "_retry": {"errors", "_clock"},
    "_times": set(),
    "_lazy": set(),
    "_httpx": set(),  # httpx without its command-line client
    "wire": _BASE,
    "storage": _BASE | {"wire"},
    "metadata": _BASE | {"wire", "_sql"},
    "coordination": _BASE | {"wire", "metadata", "_sql"},
    "client": _BASE | {"wire"},
    "cluster": _BASE | {"wire", "storage", "metadata", "coordination"},
    "server": _BASE | {"wire", "storage", "metadata", "coordination", "cluster"},
    "consumer": _BASE | {"wire", "client", "coordination"},
    "testing": _BASE | {"wire", "storage", "metadata", "coordination", "client", "consumer"},
    "spark": _BASE | {"wire", "client"},
    "pipelines": _BASE | {"wire", "client", "spark"},
    # the Kafka front end calls the service; in a cluster it reads who holds what, as server/
    "kafka": _BASE | {"wire", "server", "cluster"},
    "_sql": {"errors"},  # the one SQL engine factory, for the metadata and lease stores
}
TOP = {"cli", "cli_admin", "demo", "__main__"}  # the command line may use everything


def _layer(path: Path) -> str:
    return path.relative_to(SRC).parts[0].removesuffix(".py")


def _imported_layers(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return {name.split(".")[1] for name in names if name.startswith("loghub.")}


def test_no_module_imports_from_a_layer_above_it() -> None:
    offences = []
    for path in sorted(SRC.rglob("*.py")):
        layer = _layer(path)
        if layer in TOP:
            continue
        assert layer in ALLOWED, f"{path}: layer {layer} is not in the layer table"
        for imported in _imported_layers(path) - {layer}:
            if imported not in ALLOWED[layer]:
                offences.append(f"{path.relative_to(SRC)} imports loghub.{imported}")
    assert not offences, "\n".join(offences)


def _isort_key(name: str) -> tuple[int, str]:
    """Ruff's order for __all__: CONSTANTS, then Classes, then functions."""
    kind = 0 if name.isupper() else 1 if name[:1].isupper() else 2
    return kind, name


def test_public_names_are_sorted_and_importable() -> None:
    packages = [loghub.__name__] + [
        f"loghub.{m.name}" for m in pkgutil.iter_modules([str(SRC)]) if m.ispkg
    ]
    for name in packages:
        module = importlib.import_module(name)
        exported = getattr(module, "__all__", None)
        assert exported is not None, f"{name} has no __all__"
        assert list(exported) == sorted(exported, key=_isort_key), f"{name}.__all__ is not sorted"
        for attribute in exported:
            assert hasattr(module, attribute), f"{name}.__all__ names missing {attribute}"
