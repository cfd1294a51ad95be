"""A package's public names imported on first use (PEP 562).

For packages whose names live in modules that most processes never touch: the
``tensorplug`` command imports ``tensorplug_llm`` every time it starts, pytest imports
``tensorplug.testing``, and a GPU plugin's discovery imports ``tensorplug_kernels``
for a device description. Each name is imported from its module when first asked for
and then kept in the package, so later lookups are ordinary attribute reads.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, homes: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module ``__getattr__`` and ``__dir__`` of ``package`` (its ``__name__``),
    which finds each name of ``homes`` in the submodule it maps to:
    ``__getattr__, __dir__ = lazy_exports(__name__, {"Engine": "engine"})``. A type
    checker sees the names through imports under ``TYPE_CHECKING``."""
    namespace = sys.modules[package].__dict__

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{home}"), name)
        namespace[name] = value  # once: later lookups do not come back here
        return value

    def __dir__() -> list[str]:
        return sorted([*namespace, *homes])

    return __getattr__, __dir__
