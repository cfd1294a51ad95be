"""numba's cached kernels loaded without importing the numba modules they inlined code of.

A compiled function keeps an environment per function it inlined: the module's
globals and the Python constants its code may need. Loading a cached kernel rebuilds
each one (``numba.core.environment._rebuild_env``), importing its module for the
globals. The kernels inline numba's own ``np.empty``, ``carray`` and list code, so the
first load of every launch would import ``numba.np.arrayobj`` and
``numba.cpython.listobj`` with their string and hashing modules, a noticeable share of a
small model's launch, for globals that only object-mode code reads (``PyLower``'s global loads;
nopython code reads an environment's constants, never its globals), and none of these
kernels is object mode.

:func:`deferred_environments` rebuilds, while a kernel cache entry is read, the
environment of a numba module that is not imported yet with its name as its only
global (what numba reads back to pickle it again) and its constants as they were. An
environment of any other module, or of one already imported, is numba's own. Where
numba has no ``_rebuild_env`` to stand in for, entries load numba's way.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

from numba.core import environment
from numba.core.compiler_lock import global_compiler_lock

__all__ = ["deferred_environments", "rebuild_environment"]

_NUMBAS_OWN = "numba."
_numbas_rebuild = getattr(environment, "_rebuild_env", None)


def rebuild_environment(modname: Any, consts: Any, env_name: Any) -> Any:
    """numba's ``_rebuild_env``, except for a numba module not imported yet: its
    environment gets the module's name as its only global."""
    assert _numbas_rebuild is not None
    if (
        not isinstance(modname, str)
        or not modname.startswith(_NUMBAS_OWN)
        or (modname in sys.modules)
    ):
        return _numbas_rebuild(modname, consts, env_name)
    env = environment.lookup_environment(env_name)
    if env is not None:
        return env
    env = environment.Environment({"__name__": modname})
    env.consts[:] = consts
    env.env_name = env_name
    environment.Environment._memo[env_name] = env
    return env


@contextlib.contextmanager
def deferred_environments() -> Iterator[None]:
    """Cache entries read inside rebuild environments by :func:`rebuild_environment`
    (pickle finds ``_rebuild_env`` by name when it reads one). Held under numba's
    compiler lock, which numba's own loads and compiles take too (reentrant)."""
    if _numbas_rebuild is None:
        yield
        return
    with global_compiler_lock:
        environment._rebuild_env = rebuild_environment  # type: ignore[attr-defined]
        try:
            yield
        finally:
            environment._rebuild_env = _numbas_rebuild  # type: ignore[attr-defined]
