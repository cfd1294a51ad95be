"""The core's optional packages, and the one message for a missing one.

tensorplug requires only numpy and pluggy, so that a backend author, or an application
that never reads a GGUF file, installs nothing else. The rest comes with extras:

- ``tensorplug[gguf]``: reading GGUF files (:mod:`tensorplug.gguf`) and the conformance
  kit's float64 reference for quantized and BF16 types (its codecs are ``gguf``'s);
- ``tensorplug[rich]``: tables and progress bars on a terminal; without it the command
  prints the plain aligned text it prints with ``--plain`` or into a pipe.

A missing package is a :class:`~tensorplug.errors.MissingDependencyError` that says what
needed it and which extra brings it, raised where it is needed, never at import.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
from types import ModuleType

from .errors import MissingDependencyError

__all__ = ["EXTRAS", "available", "require"]

#: Each optional package (by import name) and the extra that installs it.
EXTRAS = {"gguf": "gguf", "rich": "rich"}


@functools.cache
def available(module: str) -> bool:
    """True when ``module`` can be imported here (found, not imported: cheap)."""
    return importlib.util.find_spec(module) is not None


def require(module: str, purpose: str) -> ModuleType:
    """Import the optional ``module``, or explain which extra brings it.

    ``purpose`` completes the sentence "... needs the gguf package", e.g. ``"reading
    GGUF files"``. An ImportError from inside an installed package (a broken install of
    its own dependencies) is not ours to explain and propagates unchanged.
    """
    top = module.partition(".")[0]
    try:
        return importlib.import_module(module)
    except ImportError as e:
        if e.name != top:
            raise
        extra = EXTRAS.get(top, top)
        raise MissingDependencyError(
            f"{purpose} needs the {top} package: pip install 'tensorplug[{extra}]'"
        ) from e
