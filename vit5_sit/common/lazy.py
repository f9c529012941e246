"""Names a package hands on from its modules, imported on first use (PEP 562), so that importing the package (and a
CLI's `--help`) does not wait for torch."""

from __future__ import annotations

import importlib
from collections.abc import Callable


def lazy_exports(package: str, exports: dict[str, str], namespace: dict) -> tuple[Callable, Callable]:
    """The ``__getattr__`` and ``__dir__`` of ``package``: ``exports`` maps a name to the submodule that defines it;
    a name, once imported, becomes an ordinary attribute in ``namespace`` (the package's globals())."""

    def __getattr__(name: str):
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{exports[name]}"), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *exports})

    return __getattr__, __dir__
