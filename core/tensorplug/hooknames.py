"""The naming convention of plugin hooks, and the names plugin API 1.3 changed.

The convention (tinygrad's template methods): an application calls a **public method**;
where the core stands between the two — it adds a check, the op-contract filter, a
fallback, or keeps the place to add one, as for graph plans and events — the plugin
implements an **underscore hook** that the public method calls (``Device.supports_op``
→ ``_supports_op``, ``Backend.graph_compute`` → ``_graph_compute``). A plain property
or query (``name``, ``memory()``, ``supports_buft``...) is implemented under its public
name. docs/writing-a-backend.md lists every hook.

API 1.0 did not follow it everywhere: ``supports_op``, the graph-plan and the event
methods were both what applications called and what plugins implemented, so the core
could not put the op contract in front of ``supports_op``. API 1.3 gave them underscore
hooks. A plugin still defining an old name keeps working for one release (until
tensorplug 0.3): :func:`adopt_old_names` moves its method to the new hook name, keeps
the public method's checks in front of it, and warns once per class.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["Guard", "adopt_old_names", "guarded", "public"]

#: What a public method checks before calling its hook: True to go on; False makes the
#: method return False at once (``supports_op`` refusing a node); an error is raised.
Guard = Callable[..., bool]

#: The release that drops the old names.
REMOVED_IN = "tensorplug 0.3"


def public(method: Callable[..., Any]) -> Callable[..., Any]:
    """Mark a base class's public method, so that :func:`adopt_old_names` knows that a
    class holding it defines no old-style hook of that name."""
    method.__tensorplug_public__ = True  # type: ignore[attr-defined]
    return method


def adopt_old_names(cls: type, renamed: Mapping[str, tuple[str, Guard | None]]) -> None:
    """Give ``cls`` the API 1.3 hook names for the API 1.0 ones it defines.

    ``renamed`` maps an old name to its hook's name and the public method's guard. For
    each old name defined in ``cls`` itself: the method becomes the hook (unless ``cls``
    defines that too), and the old name becomes a public method of ``cls`` that runs
    the guard and then *this* method. Binding the method, rather than looking the hook
    up on ``self``, keeps ``super().supports_op(op)`` in a subclass's old-style method
    from calling the subclass again.
    """
    found = [
        (old, hook, guard, method)
        for old, (hook, guard) in renamed.items()
        if (method := cls.__dict__.get(old)) is not None
        and not getattr(method, "__tensorplug_public__", False)
    ]
    if not found:
        return
    olds = ", ".join(old for old, *_ in found)
    hooks = ", ".join(hook for _, hook, *_ in found)
    warnings.warn(
        f"{cls.__module__}.{cls.__qualname__} implements plugin hooks under their API 1.0 "
        f"names ({olds}); since plugin API 1.3 a plugin implements the underscore hooks and "
        f"applications call the public names. Fix: rename them to {hooks} (the old names "
        f"work until {REMOVED_IN}; docs/writing-a-backend.md, 'Upgrading a plugin').",
        DeprecationWarning,
        stacklevel=4,  # this, __init_subclass__, ABCMeta.__new__, the class statement
    )
    for old, hook, guard, method in found:
        if hook not in cls.__dict__:
            setattr(cls, hook, method)
        setattr(cls, old, guarded(method, guard))


def guarded(method: Callable[..., Any], guard: Guard | None) -> Callable[..., Any]:
    """``method`` behind ``guard``, marked public: what a public method does, for one
    class's own implementation."""

    @functools.wraps(method)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        if guard is not None and not guard(self, *args):
            return False
        return method(self, *args, **kwargs)

    return public(call)
