"""pluggy hooks: calls that many plugins may answer, as opposed to 1:1 lookups on one Reg.

A plugin implements hooks on its :class:`~tensorplug.Reg` subclass, as methods marked
with :data:`hookimpl`; the registry registers the Reg with its plugin manager when it
registers the Reg, and unregisters it on ``unload``. Hook implementations kept
elsewhere (a module, another object) are listed in the Reg's ``hookimpls`` attribute::

    from tensorplug.hooks import hookimpl

    class FooReg(Reg):
        hookimpls = (tensorplug_foo.profiling,)        # optional, more implementers

        @hookimpl
        def tensorplug_extra_buffer_types(self, device):
            return [self._repack_buft] if device.reg is self else None

A hook implementation may take any subset of the specification's arguments. Names
are validated when the Reg is registered: a method named ``tensorplug_*`` that is no
known hook (a misspelling), or a known hook name without the ``@hookimpl`` marker, makes
the registration fail with a message naming the hook it probably meant.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import pluggy

from .errors import PluginError

if TYPE_CHECKING:
    from .buffer import BufferType
    from .device import Device, Reg

__all__ = [
    "HOOK_NAMES",
    "PROJECT",
    "HookSpecs",
    "hookimpl",
    "hookspec",
    "new_plugin_manager",
    "register_reg",
    "unregister_reg",
]

PROJECT = "tensorplug"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

_PREFIX = PROJECT + "_"
_MARKER = PROJECT + "_impl"


class HookSpecs:
    """The hook specifications; every hook name starts with ``tensorplug_``."""

    @hookspec
    def tensorplug_extra_buffer_types(self, device: Device) -> Sequence[BufferType] | None:
        """Extra buffer types ``device`` can use besides its default one.

        ggml's ``ggml_backend_dev_get_extra_bufts``: e.g. a CPU plugin offering a buffer
        type that repacks weights for its kernels. Answer None for devices you do not
        know; the registry concatenates every answer.

        The contract, as in ggml: an extra buffer type holds weights that ``device``
        reads as the first source of its matrix products (``MUL_MAT``), and its
        ``accepts(tensor)`` says which (their types and shapes). A model loader puts a
        weight there when every use of it is such a product and the type accepts it,
        and keeps everything else in ordinary memory. ``device.supports_buft`` is true
        for it, and ``device._supports_op`` true exactly for the ops that can read it.
        """

    @hookspec(firstresult=True)
    def tensorplug_get_proc(self, reg: Reg, name: str) -> Callable[..., Any] | None:
        """An extension function called ``name`` for ``reg``, or None.

        Consulted after ``reg.get_proc(name)`` returns None, so a plugin can add
        extensions to another backend's Reg (profiling, tracing) or share one.
        """


HOOK_NAMES: frozenset[str] = frozenset(n for n in vars(HookSpecs) if n.startswith(_PREFIX))


def new_plugin_manager() -> pluggy.PluginManager:
    pm = pluggy.PluginManager(PROJECT)
    pm.add_hookspecs(HookSpecs)
    return pm


class _RegHooks:
    """The hook methods of one Reg, collected without evaluating its properties.

    pluggy finds implementations with ``getattr`` over ``dir(plugin)``, which would run
    every property of the Reg (``device_count`` enumerates devices); this object holds
    only the Reg's bound hook methods.
    """

    def __init__(self, owner: str, methods: dict[str, Any]) -> None:
        self._owner = owner
        vars(self).update(methods)

    def __repr__(self) -> str:
        return f"<hooks of {self._owner}>"


def _candidates(obj: object) -> Iterator[tuple[str, Any]]:
    """``(name, value)`` of attributes that are or look like hook implementations."""
    for name in dir(obj):
        if name.startswith("__"):
            continue
        try:
            static = inspect.getattr_static(obj, name)
        except AttributeError:
            continue
        if isinstance(static, (staticmethod, classmethod)):
            static = static.__func__
        if not inspect.isroutine(static):
            continue
        if name.startswith(_PREFIX) or hasattr(static, _MARKER):
            yield name, getattr(obj, name)


def _check_names(obj: object, owner: str) -> list[tuple[str, Any]]:
    found = list(_candidates(obj))
    for name, value in found:
        if name not in HOOK_NAMES:
            close = difflib.get_close_matches(name, sorted(HOOK_NAMES), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise PluginError(
                f"{owner}: {name!r} is not a tensorplug hook{hint} Known hooks: "
                f"{', '.join(sorted(HOOK_NAMES))}."
            )
        if not hasattr(value, _MARKER):
            raise PluginError(
                f"{owner}: method {name!r} has a hook's name but no marker; decorate it with "
                "@tensorplug.hooks.hookimpl so that it is called"
            )
    return found


def register_reg(pm: pluggy.PluginManager, reg: Reg) -> list[str]:
    """Register ``reg``'s hook implementations; return the pluggy plugin names used.

    On any problem nothing stays registered and :class:`PluginError` explains it.
    """
    owner = f"backend {reg.name!r} ({type(reg).__module__}.{type(reg).__qualname__})"
    extra = getattr(reg, "hookimpls", ())
    if not isinstance(extra, (list, tuple)):
        raise PluginError(f"{owner}: 'hookimpls' must be a list or tuple, got {extra!r}")
    plugins: list[tuple[str, object]] = []
    if methods := dict(_check_names(reg, owner)):
        plugins.append((f"reg:{reg.name}", _RegHooks(owner, methods)))
    for i, obj in enumerate(extra):
        _check_names(obj, f"{owner}, hookimpls[{i}] ({obj!r})")
        plugins.append((f"reg:{reg.name}:{i}", obj))
    names: list[str] = []
    try:
        for name, plugin in plugins:
            pm.register(plugin, name=name)
            names.append(name)
        pm.check_pending()
    except (pluggy.PluginValidationError, ValueError) as e:
        unregister_reg(pm, names)
        raise PluginError(f"{owner}: invalid hook implementation: {e}") from e
    return names


def unregister_reg(pm: pluggy.PluginManager, names: Sequence[str]) -> None:
    for name in names:
        if pm.get_plugin(name) is not None:
            pm.unregister(name=name)
