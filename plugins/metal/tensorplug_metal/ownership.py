"""Who owns what pyobjc returns: the ``new*`` selectors and autorelease pools.

Objective-C's naming rule says a method whose name starts with ``new`` returns an
object the caller owns (+1). pyobjc applies the rule to class methods only; Metal
creates every resource through *instance* methods of protocols
(``-[MTLDevice newBufferWithLength:options:]``), which pyobjc takes as +0 and retains
once more — so every MTLBuffer, library, pipeline and queue would leak for the life of
the process, gigabytes for a long job (pyobjc's bug report,
https://github.com/ronaldoussoren/pyobjc/issues/690, and dipy's, which hit it:
https://github.com/dipy/dipy/issues/4190). The fix is metadata:
:func:`register_ownership` tells pyobjc, for each ``new*`` selector this plugin calls,
that the result is already retained. ``registerMetaDataForSelector`` *replaces* the
metadata pyobjc inferred, so the out-arguments (``NSError **``) and the pointer
arguments of those selectors are restated here too.

:data:`NEW_SELECTORS` is the whole list; a test reads the plugin's sources and fails
when the plugin calls a ``new*`` selector that is not in it.

The other half: ``commandBuffer``, ``computeCommandEncoder`` and friends return
autoreleased objects, which in a process without a run loop live until a pool is
drained. The backend therefore encodes each command buffer inside
``objc.autorelease_pool()``.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

__all__ = ["NEW_SELECTORS", "register_ownership"]

_RETAINED: dict[str, Any] = {"already_retained": True}
_ERROR_OUT: dict[str, Any] = {"type_modifier": b"o"}  # NSError **: an output

#: Every ``new*`` selector the plugin calls, with the metadata pyobjc needs for it.
#: Argument indices count ``self`` and ``_cmd`` (the first real argument is 2).
NEW_SELECTORS: dict[bytes, dict[str, Any]] = {
    b"newCommandQueue": {"retval": _RETAINED},
    b"newSharedEvent": {"retval": _RETAINED},
    b"newBufferWithLength:options:": {"retval": _RETAINED},
    b"newBufferWithBytes:length:options:": {
        "retval": _RETAINED,
        "arguments": {2: {"type_modifier": b"n", "c_array_length_in_arg": 3}},
    },
    b"newBufferWithBytesNoCopy:length:options:deallocator:": {
        "retval": _RETAINED,
        "arguments": {2: {"type_modifier": b"n", "c_array_length_in_arg": 3}},
    },
    b"newLibraryWithSource:options:error:": {"retval": _RETAINED, "arguments": {4: _ERROR_OUT}},
    b"newFunctionWithName:": {"retval": _RETAINED},
    b"newComputePipelineStateWithFunction:error:": {
        "retval": _RETAINED,
        "arguments": {3: _ERROR_OUT},
    },
}

#: the bridge modules already told (weakly held: an id could be reused by another)
_DONE: weakref.WeakSet[Any] = weakref.WeakSet()
_LOCK = threading.Lock()


def register_ownership(objc: Any) -> None:
    """Register :data:`NEW_SELECTORS` with pyobjc (``objc``), once per bridge module and
    before the first Metal object is created. Registered on ``NSObject`` so that the
    concrete classes behind Metal's protocols (``AGXG13GDevice``…) inherit it."""
    with _LOCK:
        if objc in _DONE:
            return
        for selector, metadata in NEW_SELECTORS.items():
            objc.registerMetaDataForSelector(b"NSObject", selector, metadata)
        _DONE.add(objc)
