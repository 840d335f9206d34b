"""Names of a package imported on first use (PEP 562), for packages whose heavy members
most importers never touch: every ``loghub`` command imports ``loghub.metadata`` for its
hash-key math and ``loghub.server`` for its configuration types, and should not pay for
SQLAlchemy or the whole server to print a table."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping


def imported_on_use(package: str, modules: Mapping[str, str]) -> Callable[[str], object]:
    """A module ``__getattr__`` for ``package``: each name of ``modules`` is imported from
    the module it maps to when first asked for, then kept in the package like any other."""

    def __getattr__(name: str) -> object:
        module = modules.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
